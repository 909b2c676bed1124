"""Stored results as flat rows (pure): CSV and JSON Lines for pandas, Prometheus text format.

One row per result x measured level: decode runs give one row (``level`` "all"), serving runs one
per concurrency level or request rate, all-reduce runs one per variant x message size, fusion runs
one per token count x mode. Every row carries the result's identity, the configuration fingerprint
and the configuration itself flattened (``config.server_args.tp_size``, ``config.env.NCCL_ALGO``,
``config.sglang_version``, ``config.patched_gates``), then the level's figures flattened
(``ttft_ms.p99``, ``latency_us``). Lists (per-trial values, raw samples) are left out.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from typing import Iterable, Mapping, Sequence

from gpuops.bench.record import JSONObject, ResultDocument
from gpuops.bench.suites import ExportLevel, reader

# One exported row: column -> a scalar of the result, its level or its configuration (JSON's own kinds).
Row = JSONObject


IDENTITY = ("result_id", "host", "suite", "tool", "created", "ok", "partial", "simulated", "speed_model",
            "fingerprint", "repeat", "repeat_index", "level", "concurrency", "request_rate", "variant", "tokens", "cuda_graph")
_SKIP = frozenset({"tool_record", "variant", "samples", "chunks", "first_error", "source", "note"})


def _flatten(prefix: str, value: object, out: Row) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if key in _SKIP:
                continue
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
    elif isinstance(value, (list, tuple)):
        return  # per-trial lists and raw data: not a column
    else:
        out[prefix] = value


def _levels(result: ResultDocument) -> list[ExportLevel]:
    """(identity columns of the level, its figures) for every measured level of one result."""

    return reader(result.get("suite")).levels(result)


def rows(results: Iterable[ResultDocument]) -> list[Row]:
    out = []
    for result in results:
        server = result.get("server") or {}
        speed = server.get("speed_model")
        base: Row = {
            "result_id": result.get("id"), "host": result.get("host"), "suite": result.get("suite"),
            "tool": result.get("tool"), "created": result.get("created"), "ok": result.get("ok"),
            "partial": result.get("partial"), "simulated": bool(server.get("simulated")),
            "speed_model": (speed.get("name") if isinstance(speed, Mapping) else speed) if speed else None,
            "fingerprint": result.get("fingerprint"),
            "repeat": (result.get("summary") or {}).get("repeat") or 1,
        }
        config: Row = {}
        configuration = (result.get("configuration") or {}).copy()
        gates = configuration.pop("patched_gates", None)
        _flatten("config", configuration, config)
        config["config.patched_gates"] = ";".join(gates) if gates else ""
        for identity, figures in _levels(result):
            row = dict(base)
            row.update(identity)
            flat: Row = {}
            _flatten("", figures, flat)
            for key in IDENTITY:
                flat.pop(key, None)
            row.update(flat)
            row.update(config)
            out.append(row)
    return out


def columns(table: Sequence[Mapping[str, object]]) -> list[str]:
    """Identity first, then figures (sorted), then the configuration (sorted)."""
    keys = {k for row in table for k in row}
    ident = [k for k in IDENTITY if k in keys]
    rest = sorted(k for k in keys if k not in IDENTITY)
    return ident + [k for k in rest if not k.startswith("config.")] + [k for k in rest if k.startswith("config.")]


def to_csv(table: Sequence[Mapping[str, object]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns(table), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buffer.getvalue()


def to_jsonl(table: Sequence[Mapping[str, object]]) -> str:
    return "".join(json.dumps(row, sort_keys=False, default=str) + "\n" for row in table)


_NAME = re.compile(r"[^a-zA-Z0-9_]")
_LABELS = ("result_id", "host", "suite", "level", "fingerprint", "simulated")


def _metric_name(key: str) -> str:
    return "gpuops_bench_" + _NAME.sub("_", key).strip("_").lower()


def _label_value(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def to_prometheus(table: Sequence[Mapping[str, object]]) -> str:
    """Prometheus text exposition format: one gauge per numeric figure, labelled by result and level
    (a textfile-collector file: node_exporter's ``--collector.textfile.directory`` reads it)."""
    series: dict[str, list[str]] = {}
    for row in table:
        labels = ",".join(f'{k}="{_label_value(row.get(k))}"' for k in _LABELS if row.get(k) is not None)
        for key, value in row.items():
            if key in IDENTITY or key.startswith("config."):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            series.setdefault(_metric_name(key), []).append(f"{_metric_name(key)}{{{labels}}} {value!r}")
    lines = []
    for name in sorted(series):
        lines.append(f"# TYPE {name} gauge")
        lines.extend(series[name])
    return "\n".join(lines) + ("\n" if lines else "")
