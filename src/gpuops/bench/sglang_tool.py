"""SGLang's own benchmark output, read into gpuops' result schema (pure).

``sglang.bench_serving --output-file F`` appends one JSON line per run with fields such as
``max_concurrency``, ``request_throughput``, ``output_throughput``, ``median_ttft_ms``,
``p99_itl_ms``, ``median_tpot_ms``, ``accept_length`` (and, with ``--output-details``, per-request
``ttfts``/``itls``/``output_lens``). ``sglang.bench_one_batch_server --result-filename F`` appends
``batch_size``, ``latency`` (s), ``last_ttft`` (s), ``last_gen_throughput`` (tok/s), ``acc_length``.
"""

from __future__ import annotations

from typing import Mapping

from gpuops.bench.record import JSONObject, Percentiles, Summary
from gpuops.errors import GpuopsError


def _num(record: Mapping[str, object], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _per_token_rate(tpot_ms: float | None) -> float | None:
    return 1000.0 / tpot_ms if tpot_ms else None


_PER_REQUEST = ("ttfts", "itls", "output_lens")  # moved to the result's samples, not dropped


def _stats(record: Mapping[str, object], name: str) -> Percentiles:
    """mean/median/std/p90/p95/p99 of one bench_serving latency (``mean_ttft_ms`` ...); p50 = median."""
    out = {stat: _num(record, f"{stat}_{name}_ms") for stat in ("mean", "median", "std", "p90", "p95", "p99")}
    out["p50"] = out["median"]
    return out


def failed_requests(record: Mapping[str, object], expected: int | None) -> int | None:
    """Failures as the tool saw them: its per-request errors, else asked minus completed; None if unknown."""
    errors = record.get("errors")
    if isinstance(errors, list) and errors:
        return sum(1 for e in errors if e)
    completed = record.get("completed")
    if isinstance(expected, int) and isinstance(completed, int):
        return max(0, expected - completed)
    return None


def serving_level(record: Mapping[str, object], expected: int | None = None) -> JSONObject:
    """One bench_serving JSONL line -> one serving level of our schema, every field of it kept.

    Our names get the tool's figures; ``tool_record`` holds the line itself (less the per-request
    arrays, which become the result's samples), so nothing SGLang reported is lost.
    """
    if "output_throughput" not in record or "completed" not in record:
        raise GpuopsError("sglang.bench_serving output line lacks output_throughput/completed")
    failed = failed_requests(record, expected)
    completed = record.get("completed")
    level: JSONObject = {
        "concurrency": record.get("max_concurrency"),
        "request_rate": _num(record, "request_rate"),
        "requests": (completed + failed) if isinstance(completed, int) and failed is not None else completed,
        "completed": completed,
        "failed": failed,
        "duration_s": _num(record, "duration"),
        "request_throughput": _num(record, "request_throughput"),
        "input_tokens_per_s": _num(record, "input_throughput"),
        "total_output_tokens_per_s": _num(record, "output_throughput"),
        "total_tokens_per_s": _num(record, "total_throughput"),
        # per-stream decode rate: SGLang's time per output token, inverted
        "output_tokens_per_s": _per_token_rate(_num(record, "mean_tpot_ms")),
        "output_tokens": record.get("total_output_tokens"),
        "input_tokens": record.get("total_input_tokens"),
        "ttft_ms": _stats(record, "ttft"),
        "tpot_ms": _stats(record, "tpot"),
        "itl_ms": _stats(record, "itl"),
        "e2e_latency_ms": _stats(record, "e2e_latency"),
        "accept_length": _num(record, "accept_length"),
        "source": "sglang.bench_serving",
        "tool_record": {k: v for k, v in record.items() if k not in _PER_REQUEST},
    }
    if level["concurrency"] is None and level["request_rate"] is None:
        level["concurrency"] = record.get("request_rate")
    return level


def serving_samples(record: Mapping[str, object]) -> list[JSONObject]:
    """Per-request raw figures when bench_serving ran with --output-details."""
    ttfts, itls, lens = (value if isinstance(value, list) else []
                         for value in (record.get("ttfts"), record.get("itls"), record.get("output_lens")))
    samples: list[JSONObject] = []
    for i, ttft in enumerate(ttfts):
        samples.append({
            "index": i, "concurrency": record.get("max_concurrency"),
            "ttft_s": ttft, "itls_s": itls[i] if i < len(itls) else None,
            "completion_tokens": lens[i] if i < len(lens) else None,
        })
    return samples


def _positive(record: Mapping[str, object], key: str) -> float | None:
    """A figure above 0, else None (SGLang's -1: not measured)."""
    value = _num(record, key)
    return value if value is not None and value > 0 else None


def one_batch_summary(record: Mapping[str, object]) -> Summary:
    """One bench_one_batch_server JSONL line -> a decode summary of our schema.

    The per-stream decode rate is the tool's own measurement, ``output_throughput`` (batch x
    output_len over the time after the first token) per request. ``last_gen_throughput`` is the
    server's scheduler statistic of its last logging interval, idle time included: a real 0.5.16 on
    an H200 reported 0.93 tok/s beside a measured 501.23 (benchmarks/results/h200-x1/real-sglang);
    it is kept as the server said it, never as the rate. SGLang writes -1 for what it has not.
    """
    if "last_gen_throughput" not in record or "latency" not in record:
        raise GpuopsError("sglang.bench_one_batch_server output line lacks last_gen_throughput/latency")
    size = record.get("batch_size")
    batch = size if isinstance(size, int) and size > 0 else 1
    measured = _positive(record, "output_throughput")
    rate = measured / batch if measured is not None else _positive(record, "last_gen_throughput")
    ttft = _num(record, "last_ttft")
    return {
        "batch_size": record.get("batch_size"),
        "requests": record.get("batch_size"),
        "completed": record.get("batch_size"),
        "failed": 0,
        "output_tokens_per_s": rate,
        "ttft_ms": {"mean": None, "p50": ttft * 1000.0 if ttft is not None else None, "p90": None, "p99": None},
        # the tool reports no token-level timings; a steady decode's ITL is the inverse rate
        "itl_ms": {"mean": 1000.0 / rate if rate else None, "p50": 1000.0 / rate if rate else None,
                   "p90": None, "p99": None},
        "e2e_latency_ms": {"p50": (_num(record, "latency") or 0) * 1000.0, "p90": None, "p99": None},
        "total_output_tokens_per_s": measured,
        "server_last_gen_throughput": _positive(record, "last_gen_throughput"),
        "accept_length": _positive(record, "acc_length"),
        "input_len": record.get("input_len"),
        "output_len": record.get("output_len"),
        "tool_record": dict(record),
        "source": "sglang.bench_one_batch_server",
    }
