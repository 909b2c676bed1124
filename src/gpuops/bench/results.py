"""One host's bench run -> one result document (pure).

The document carries everything needed to trust it later: the host facts snapshot, the server's
flags and environment, the SGLang version and patched gates (the configuration and its
fingerprint), the suite options, the raw samples and the summary.

Schema ``gpuops.bench.result/1`` (top-level keys): ``schema``, ``id``, ``run_id``, ``host``,
``suite``, ``created`` (ISO-8601 UTC), ``ok``, ``partial``, ``errors``, ``options``, ``server``
(``url``, ``server_args``, ``env``, ``version``, ``model_path``, ``simulated``, and from a stand-in
``speed_model``: its name, version, shape, label and figures), ``host_facts``,
``configuration`` (the fingerprint's inputs), ``fingerprint``, ``summary``, ``levels`` (serving),
``allreduce`` (rows), ``samples`` (raw).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Mapping

from gpuops.bench.fingerprint import configuration, fingerprint, public_server_record
from gpuops.bench.frames import RemoteRun
from gpuops.bench.options import BenchOptions
from gpuops.bench.simulated import model_label
from gpuops.bench.sglang_tool import one_batch_summary, serving_level, serving_samples
from gpuops.bench.suites import is_torchrun, reader
from gpuops.remote.bench_stats import summarize_samples

SCHEMA = "gpuops.bench.result/1"
# Keys of /get_server_info that are not server arguments (real SGLang flattens its args in).
_INFO_NOT_ARGS = frozenset({"internal_states", "version", "simulated", "speed_model", "env", "server_args", "status",
                            "max_total_num_tokens", "max_req_input_len", "memory_usage"})


@dataclass(frozen=True)
class RunContext:
    host: str
    options: BenchOptions
    url: str
    started: float  # epoch seconds, for the id and `created`
    remote: bool = True


def result_id(host: str, run_id: str) -> str:
    return hashlib.sha256(f"{run_id}/{host}".encode()).hexdigest()[:10]


def server_record(run: RemoteRun) -> dict[str, Any]:
    snapshot = run.server or {}
    info = snapshot.get("server_info") or {}
    args = info.get("server_args")
    if not isinstance(args, dict):
        args = {k: v for k, v in info.items() if k not in _INFO_NOT_ARGS}
    env: dict[str, Any] = {}
    env.update(snapshot.get("process_env") or {})
    env.update(info.get("env") or {})
    model = (snapshot.get("model_info") or {}).get("model_path") or args.get("model_path")
    record = {
        "url": snapshot.get("url"),
        "server_args": args,
        "env": env,
        "version": info.get("version"),
        "model_path": model,
        "simulated": bool(info.get("simulated")),
        "internal_states": info.get("internal_states"),
    }
    if record["simulated"]:
        # Where a simulated figure comes from travels with it (the stand-in's model, shape, version).
        record["speed_model"] = info.get("speed_model") if isinstance(info.get("speed_model"), dict) else None
    for key in ("server_info_error", "model_info_error", "pid", "process_cmdline"):
        if snapshot.get(key) is not None:
            record[key] = snapshot[key]
    return record


def accept_length(run: RemoteRun) -> float | None:
    for source in (run.server_after or {}, (run.server or {}).get("server_info") or {}):
        for state in source.get("internal_states") or []:
            if isinstance(state, dict) and isinstance(state.get("avg_spec_accept_length"), (int, float)):
                return float(state["avg_spec_accept_length"])
    return None


def variant_label(variant: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(variant.items())) or "default"


def allreduce_summary(rows: list[dict[str, Any]], errors: list[dict[str, Any]]) -> dict[str, Any]:
    variants: dict[str, dict[str, Any]] = {}
    for row in rows:
        label = variant_label(row.get("variant") or {})
        entry = variants.setdefault(label, {"label": label, "variant": row.get("variant") or {}, "ok": True,
                                            "latency_us": {}, "busbw_gbps": {}, "step_cost_ms": {}})
        if row.get("ok"):
            key = str(row["tokens"])
            entry["latency_us"][key] = row["latency_us"]
            entry["busbw_gbps"][key] = row["busbw_gbps"]
            entry["step_cost_ms"][key] = row["step_cost_ms"]
        else:
            entry["ok"] = False
            entry["error"] = row.get("error")
    for err in errors:
        if "variant" in err:
            label = variant_label(err.get("variant") or {})
            entry = variants.setdefault(label, {"label": label, "variant": err.get("variant") or {},
                                                "latency_us": {}, "busbw_gbps": {}, "step_cost_ms": {}})
            entry["ok"] = False
            entry.setdefault("error", err.get("message"))
            if err.get("timed_out"):
                entry["timed_out"] = True
    ranked = [v for v in variants.values() if v["ok"] and v["latency_us"]]
    smallest = None
    if ranked:
        smallest = min(int(k) for v in ranked for k in v["latency_us"])
        ranked = [v for v in ranked if str(smallest) in v["latency_us"]]
        ranked.sort(key=lambda v: v["latency_us"][str(smallest)])
    first = rows[0] if rows else {}
    return {
        "variants": list(variants.values()),
        "best_variant": ranked[0]["label"] if ranked else None,
        "ranked_at_tokens": smallest,
        "world_size": first.get("world_size"),
        "hidden_size": first.get("hidden_size"),
        "backend": first.get("backend"),
        "cuda_graph": first.get("cuda_graph"),
        "allreduces_per_step": first.get("allreduces_per_step"),
        "step_cost_ms": ranked[0]["step_cost_ms"].get(str(smallest)) if ranked else None,
    }


def fusion_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Fused vs unfused per token count and mode; the headline is the decode case (fewest tokens,
    CUDA graph, as SGLang replays decode) and its cost over one forward pass."""
    measured = [r for r in rows if r.get("fused_us") is not None]
    reasons = sorted({r["error"] for r in rows if not r.get("ok") and r.get("error")})
    first = rows[0] if rows else {}
    summary: dict[str, Any] = {
        "world_size": first.get("world_size"), "hidden_size": first.get("hidden_size"),
        "allreduces_per_step": first.get("allreduces_per_step"), "gpu": first.get("gpu"),
        "flashinfer_version": first.get("flashinfer_version"), "tolerance": first.get("tolerance"),
        "all_correct": bool(measured) and all(r.get("correct") for r in measured),
        "reasons": reasons,
        "table": [{k: r.get(k) for k in ("tokens", "cuda_graph", "fused_us", "unfused_nccl_us", "unfused_ipc_us",
                                          "nccl_allreduce_us", "saving_us", "speedup", "saving_step_ms",
                                          "fused_step_ms", "unfused_nccl_step_ms", "rel_err_worst_rank", "correct")}
                  for r in measured],
    }
    graphed = [r for r in measured if r.get("cuda_graph")] or measured
    if graphed:
        head = min(graphed, key=lambda r: r["tokens"])
        summary.update({"headline_tokens": head["tokens"], "headline_cuda_graph": head.get("cuda_graph"),
                        "fused_us": head["fused_us"], "unfused_us": head.get("unfused_nccl_us"),
                        "fused_step_ms": head.get("fused_step_ms"), "unfused_step_ms": head.get("unfused_nccl_step_ms"),
                        "saving_step_ms": head.get("saving_step_ms")})
    return summary


def _num_prompts(args: list[str]) -> int | None:
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--num-prompts=") else (
            args[i + 1] if arg == "--num-prompts" and i + 1 < len(args) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def serving_summary(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline of a serving run is its peak throughput (and its peak goodput under the SLO
    when one was given), not the lowest level's per-stream rate, which is kept alongside."""
    if not levels:
        return {"levels": 0}
    ordered = sorted(levels, key=lambda lv: (lv.get("concurrency") or 0, lv.get("request_rate") or 0))
    lowest = ordered[0]
    peak = max(levels, key=lambda lv: lv.get("total_output_tokens_per_s") or 0)
    good = [lv for lv in levels if isinstance(lv.get("goodput_request_per_s"), (int, float))]
    best_good = max(good, key=lambda lv: lv["goodput_request_per_s"]) if good else None
    return {
        "peak_request_throughput": peak.get("request_throughput"),
        "peak_request_rate": peak.get("request_rate"),
        "peak_goodput_request_per_s": best_good.get("goodput_request_per_s") if best_good else None,
        "peak_goodput_concurrency": best_good.get("concurrency") if best_good else None,
        "peak_goodput_total_output_tokens_per_s": best_good.get("total_output_tokens_per_s") if best_good else None,
        "slo": (best_good or {}).get("slo"),
        "levels": len(levels),
        "output_tokens_per_s": lowest.get("output_tokens_per_s"),
        "ttft_ms": lowest.get("ttft_ms"),
        "itl_ms": lowest.get("itl_ms"),
        "peak_total_output_tokens_per_s": peak.get("total_output_tokens_per_s"),
        "peak_concurrency": peak.get("concurrency"),
        "completed": sum(lv.get("completed") or 0 for lv in levels),
        "failed": sum(lv.get("failed") or 0 for lv in levels) if all(
            lv.get("failed") is not None for lv in levels) else None,
    }


def build_result(ctx: RunContext, run: RemoteRun, transport_error: str | None = None) -> dict[str, Any]:
    options = ctx.options
    server = server_record(run)
    host_facts = dict(run.host) if run.host else None
    patched = list((host_facts or {}).pop("patched_sources", []) or [])
    errors = [e.get("message", str(e)) for e in run.errors]
    if transport_error:
        errors.append(transport_error)
    levels: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = list(run.samples)
    if options.tool:
        if options.suite == "decode":
            summary = one_batch_summary(run.tool[-1]) if run.tool else {}
        else:
            from gpuops.bench.options import tool_runs

            asked = [_num_prompts(args) for args in tool_runs(options)[2]]
            levels = [serving_level(r, asked[r["_run_index"]] if isinstance(r.get("_run_index"), int)
                                    and r["_run_index"] < len(asked) else None) for r in run.tool]
            samples = [s for r in run.tool for s in serving_samples(r)]
            summary = serving_summary(levels)
    elif options.suite == "decode":
        summary = summarize_samples(run.samples, None, dict(options.slo) or None)
    elif options.suite == "serving":
        levels = list(run.levels)
        summary = serving_summary(levels)
    elif options.suite == "fusion":
        summary = fusion_summary(list(run.fusion))
        errors.extend(r for r in summary["reasons"] if r not in errors)
    else:
        rows = list(run.allreduce)
        summary = allreduce_summary(rows, run.errors)
    failed = [s for s in samples if s.get("ok") is False]
    if failed:
        errors.append(f"{len(failed)} of {len(samples)} requests failed; first: {failed[0].get('error')}")
    if options.suite == "fusion":
        if not run.fusion and not errors:
            errors.append("no fusion measurement came back")
    elif options.suite != "allreduce":
        spec = accept_length(run)
        if spec is not None and summary.get("accept_length") is None:
            summary["accept_length"] = spec
        if not summary.get("completed") and not errors:
            errors.append("no request completed")
    elif not any(r.get("ok") for r in rows) and not errors:
        errors.append("no all-reduce measurement came back")
    extra = None
    micro = is_torchrun(options.suite)
    if micro:
        extra = {"allreduce_world_size": summary.get("world_size"), "allreduce_backend": summary.get("backend")}
    config = configuration(server["server_args"] if not micro else {},
                           server["env"] if not micro else {},
                           server["version"], patched, extra)
    rid = result_id(ctx.host, run.run_id)
    document = {
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
    }
    from gpuops.bench.repeats import within_run
    from gpuops.bench.stats import intervals_json

    document["intervals"] = intervals_json(within_run(document))
    return document


def headline(result: Mapping[str, Any]) -> dict[str, Any]:
    """The per-host line of ``gpuops bench --json`` and of the tables."""
    summary = result.get("summary") or {}
    ttft = summary.get("ttft_ms") or {}
    itl = summary.get("itl_ms") or {}
    line = {
        "ok": bool(result.get("ok")),
        "suite": result.get("suite"),
        "partial": bool(result.get("partial")),
        "output_tokens_per_s": summary.get("output_tokens_per_s"),
        "ttft_ms": ttft.get("p50") if isinstance(ttft, dict) else ttft,
        "itl_ms": {"p50": itl.get("p50"), "p90": itl.get("p90"), "p99": itl.get("p99")} if isinstance(itl, dict) else {},
        "accept_length": summary.get("accept_length"),
        "result_id": result.get("id"),
        "fingerprint": result.get("fingerprint"),
        "simulated": bool((result.get("server") or {}).get("simulated")),
        "speed_model": model_label(result),
        "error": "; ".join(result.get("errors") or []) or None,
    }
    line.update(reader(result.get("suite")).headline(summary, result))
    return line
