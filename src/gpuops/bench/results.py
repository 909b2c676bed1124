"""One host's bench run -> one result document (pure).

The document carries everything needed to trust it later: the host facts snapshot, the server's
flags and environment, the SGLang version and patched gates (the configuration and its
fingerprint), the suite options, the raw samples and the summary.

Schema ``gpuops.bench.result/1`` (top-level keys): ``schema``, ``id``, ``run_id``, ``host``,
``suite``, ``created`` (ISO-8601 UTC), ``ok``, ``partial``, ``errors``, ``options``, ``server``
(``url``, ``server_args``, ``env``, ``version``, ``model_path``, ``simulated``, and from a stand-in
``speed_model``: its name, version, shape, label and figures), ``host_facts``,
``configuration`` (the fingerprint's inputs), ``fingerprint``, ``summary``, ``levels`` (serving),
``allreduce`` (rows), ``samples`` (raw), ``server_metrics`` (the server's ``/metrics`` deltas over
the run: ``exposed``, ``deltas``, ``error``; null when no server was asked).
"""

from __future__ import annotations

import hashlib
import time
from typing import Mapping, TypeGuard

from gpuops.bench.fingerprint import configuration, fingerprint, public_server_record
from gpuops.bench.frames import RemoteRun
from gpuops.bench.options import BenchOptions
from gpuops.bench.record import (Headline, JSONObject, ResultDocument, ServerMetrics, ServerRecord, SpeedModelRecord,
                                 mapping, texts)
from gpuops.bench.simulated import model_label
from gpuops.bench.suites import is_torchrun, reader
from gpuops.bench.repeats import within_run
from gpuops.bench.stats import intervals_json
from gpuops.facts.server_args import settings_from_argv
from gpuops.facts.speculative import SpeculativeJSON, judge
from gpuops.remote.prom_text import run_deltas
from gpuops.frozen import frozen

SCHEMA = "gpuops.bench.result/1"
# Keys of /get_server_info that are not server arguments (real SGLang flattens its args in).
_INFO_NOT_ARGS = frozenset({"internal_states", "version", "simulated", "speed_model", "env", "server_args", "status",
                            "max_total_num_tokens", "max_req_input_len", "memory_usage", "launch_command",
                            "startup_time", "frontend", "kv_events"})


@frozen
class RunContext:
    """What a result records of the run around one host's measurement: the host, the options, the server URL the
    client used, when the run started, and whether the client ran on the host."""

    host: str
    options: BenchOptions
    url: str
    started: float  # epoch seconds, for the id and `created`
    remote: bool = True


def result_id(host: str, run_id: str) -> str:
    return hashlib.sha256(f"{run_id}/{host}".encode()).hexdigest()[:10]


def server_record(run: RemoteRun) -> ServerRecord:
    snapshot = run.server or {}
    info = mapping(snapshot.get("server_info"))
    given = info.get("server_args")
    args: Mapping[str, object] = given if isinstance(given, dict) else {k: v for k, v in info.items()
                                                                       if k not in _INFO_NOT_ARGS}
    env: JSONObject = {}
    env.update(mapping(snapshot.get("process_env")))
    env.update(mapping(info.get("env")))
    model = mapping(snapshot.get("model_info")).get("model_path") or args.get("model_path")
    version = info.get("version")
    speed_model = info.get("speed_model")
    record: ServerRecord = {
        "url": snapshot.get("url"),
        "server_args": args,
        "env": env,
        "version": version if isinstance(version, str) else None,
        "model_path": model,
        "simulated": bool(info.get("simulated")),
        "internal_states": info.get("internal_states"),
        "launch_command": info.get("launch_command"),  # 0.5.23+: the command line as given (masked on arrival)
    }
    if record["simulated"]:
        # Where a simulated figure comes from travels with it (the stand-in's model, shape, version).
        record["speed_model"] = _speed_model(speed_model)
    record["routes"] = snapshot.get("routes")  # which routes answered (/server_info or /get_server_info ...)
    if snapshot.get("server_info_error") is not None:
        record["server_info_error"] = snapshot["server_info_error"]
    if snapshot.get("model_info_error") is not None:
        record["model_info_error"] = snapshot["model_info_error"]
    if snapshot.get("pid") is not None:
        record["pid"] = snapshot["pid"]
    if snapshot.get("process_cmdline") is not None:
        record["process_cmdline"] = snapshot["process_cmdline"]
    record["speculative_in_effect"] = _speculative(snapshot, args) if snapshot else None
    return record

def _is_speed_model(value: object) -> TypeGuard[SpeedModelRecord]:
    """Whether a stand-in's ``speed_model`` answer reads as one (its figures, if any, a list of objects)."""
    if not isinstance(value, dict):
        return False
    figures = value.get("figures")
    return figures is None or isinstance(figures, list) and all(isinstance(f, dict) for f in figures)


def _speed_model(value: object) -> SpeedModelRecord | None:
    return value if _is_speed_model(value) else None


def _speculative(snapshot: Mapping[str, object], args: Mapping[str, object]) -> SpeculativeJSON:
    """Speculative decoding as the benched server ran it: its resolved settings (``args``, from
    ``/server_info``) first, its command line's flags beside them (``facts/speculative.py``)."""

    argv = snapshot.get("process_cmdline")
    launched = settings_from_argv([str(w) for w in argv]).speculative if isinstance(argv, list) else None
    info = snapshot.get("server_info")
    reported = ({"route": mapping(snapshot.get("routes")).get("server_info"), "settings": dict(args)}
                if isinstance(info, Mapping) else {"error": snapshot.get("server_info_error") or "no server_info"})
    return judge(launched, reported, running=True).to_json()


def build_result(ctx: RunContext, run: RemoteRun, transport_error: str | None = None) -> ResultDocument:
    options = ctx.options
    server = server_record(run)
    host_facts = dict(run.host) if run.host else None
    patched_sources = (host_facts or {}).pop("patched_sources", None) or []
    patched = [str(p) for p in patched_sources] if isinstance(patched_sources, list) else []
    # a host's error record says its message (text); one without says itself
    errors = texts([e.get("message", str(e)) for e in run.errors])
    if transport_error:
        errors.append(transport_error)
    suite = reader(options.suite)
    parts = suite.summarize(run, options)
    summary, levels, rows = parts.summary, parts.levels, parts.rows
    samples = list(run.samples) if parts.samples is None else parts.samples
    errors.extend(e for e in parts.errors if e not in errors)
    failed = [sample for sample in samples if sample.get("ok") is False]
    if failed:
        errors.append(f"{len(failed)} of {len(samples)} requests failed; first: {failed[0].get('error')}")
    errors.extend(suite.finish(run, summary, rows, errors))
    extra = None
    micro = is_torchrun(options.suite)
    if micro:
        extra = {"allreduce_world_size": summary.get("world_size"), "allreduce_backend": summary.get("backend")}
    config = configuration(server.get("server_args") if not micro else {},
                           server.get("env") if not micro else {},
                           server.get("version"), patched, extra)
    rid = result_id(ctx.host, run.run_id)
    document: ResultDocument = {
        "schema": SCHEMA,
        "id": rid,
        "run_id": run.run_id,
        "host": ctx.host,
        "suite": options.suite,
        "tool": options.tool,
        "api": options.api,
        "remote": ctx.remote,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.started)),
        "ok": not errors and not run.partial,
        "partial": run.partial,
        "errors": errors,
        "notes": run.notes,
        "options": options.as_record(),
        "server": public_server_record(server),
        "host_facts": host_facts,
        "configuration": config,
        "fingerprint": fingerprint(config),
        "summary": summary,
        "levels": levels,
        "allreduce": rows,
        "fusion": list(run.fusion),
        "samples": samples,
        "server_metrics": server_metrics(run),
    }

    document["intervals"] = intervals_json(within_run(document))
    return document


def server_metrics(run: RemoteRun) -> ServerMetrics | None:
    """What the run made the server do, from its ``/metrics`` before and after (``prom_text``):
    ``{"exposed": bool, "deltas": {...} | None, "error"}``; None when the suite asks no server."""

    snapshot = run.server or {}
    if not snapshot:
        return None
    after = run.server_after or {}
    exposed = bool(snapshot.get("metrics_exposed"))
    return {"exposed": exposed,
            "deltas": run_deltas(snapshot.get("metrics"), after.get("metrics")) if exposed else None,
            "error": snapshot.get("metrics_error") or after.get("metrics_error")}


def headline(result: ResultDocument) -> Headline:
    """The per-host line of ``gpuops bench --json`` and of the tables."""
    summary = result.get("summary") or {}
    ttft = summary.get("ttft_ms") or {}
    itl = summary.get("itl_ms") or {}
    line: Headline = {
        "ok": bool(result.get("ok")),
        "suite": result.get("suite"),
        "partial": bool(result.get("partial")),
        "output_tokens_per_s": summary.get("output_tokens_per_s"),
        "ttft_ms": ttft.get("p50"),
        "itl_ms": {"p50": itl.get("p50"), "p90": itl.get("p90"), "p99": itl.get("p99")},
        "accept_length": summary.get("accept_length"),
        "result_id": result.get("id"),
        "fingerprint": result.get("fingerprint"),
        "simulated": bool((result.get("server") or {}).get("simulated")),
        "speed_model": model_label(result),
        "error": "; ".join(result.get("errors") or []) or None,
        "server_metrics": ((result.get("server_metrics") or {}).get("deltas")),
        "speculative": (result.get("server") or {}).get("speculative_in_effect"),
    }
    line.update(reader(result.get("suite")).headline(summary, result))
    return line
