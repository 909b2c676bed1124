"""Latency and throughput figures of measured requests, as SGLang's bench_serving computes them.

One copy for both sides: the host's bench client summarises a serving level with it, and the
client's results and report (``gpuops.bench.results``, ``gpuops.bench.report``) recompute figures
from the raw samples with the same code. Stdlib only, Python 3.8+.
"""


def sample_figures(sample):
    """TTFT, decode rate and per-token ITLs of one successful sample (seconds, tokens/s)."""
    chunks = sample["chunks"]
    t_first, n_first = chunks[0]
    t_last, n_last = chunks[-1]
    itls = []
    for (t0, c0), (t1, c1) in zip(chunks, chunks[1:]):
        tokens = c1 - c0
        if tokens > 0:
            itls.extend([(t1 - t0) / tokens] * tokens)
    decode_tokens = n_last - n_first
    decode_s = t_last - t_first
    return {
        "ttft_s": t_first,
        "decode_tokens": decode_tokens,
        "decode_s": decode_s,
        "tokens_per_s": (decode_tokens / decode_s) if decode_s > 0 else None,
        "itls_s": itls,
    }


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def describe(values):
    """bench_serving's statistics of one latency: mean, median (also as p50), std, p90, p95, p99."""
    if not values:
        return {"mean": None, "median": None, "std": None, "p50": None, "p90": None, "p95": None, "p99": None}
    n = len(values)
    mean = sum(values) / float(n)
    std = (sum((v - mean) ** 2 for v in values) / float(n)) ** 0.5  # population std, as numpy's default
    median = percentile(values, 50)
    return {"mean": mean, "median": median, "std": std, "p50": median, "p90": percentile(values, 90),
            "p95": percentile(values, 95), "p99": percentile(values, 99)}


def request_tpot_ms(sample, figures):
    """Time per output token after the first, per request: (E2E - TTFT) / (output tokens - 1)."""
    tokens = sample.get("completion_tokens") or 0
    if tokens < 2 or sample.get("e2e_s") is None:
        return None
    return (sample["e2e_s"] - figures["ttft_s"]) * 1000.0 / (tokens - 1)


def meets_slo(sample, figures, slo):
    """Whether one completed request met every SLO given (ttft_ms, tpot_ms, e2e_ms, itl_ms: p99 of its own)."""
    checks = {
        "ttft_ms": figures["ttft_s"] * 1000.0,
        "tpot_ms": request_tpot_ms(sample, figures),
        "e2e_ms": (sample.get("e2e_s") or 0) * 1000.0,
        "itl_ms": percentile([x * 1000.0 for x in figures["itls_s"]], 99),
    }
    for key, limit in slo.items():
        value = checks.get(key)
        if value is not None and value > float(limit):
            return False
    return True


def summarize_samples(samples, duration_s=None, slo=None):
    good = [s for s in samples if s.get("ok")]
    figures = [sample_figures(s) for s in good]
    decode_tokens = sum(f["decode_tokens"] for f in figures)
    decode_s = sum(f["decode_s"] for f in figures)
    ttfts = [f["ttft_s"] * 1000.0 for f in figures]
    itls = [x * 1000.0 for f in figures for x in f["itls_s"]]
    e2e = [s["e2e_s"] * 1000.0 for s in good if s.get("e2e_s") is not None]
    tpots = [t for t in (request_tpot_ms(s, f) for s, f in zip(good, figures)) if t is not None]
    summary = {
        "requests": len(samples),
        "completed": len(good),
        "failed": len(samples) - len(good),
        "output_tokens": sum(s.get("completion_tokens") or 0 for s in good),
        "input_tokens": sum(s.get("prompt_tokens") or 0 for s in good),
        # decode rate of one stream: tokens after the first over the time after the first
        "output_tokens_per_s": (decode_tokens / decode_s) if decode_s > 0 else None,
        "ttft_ms": describe(ttfts),
        "tpot_ms": describe(tpots),
        "itl_ms": describe(itls),
        "e2e_latency_ms": describe(e2e),
    }
    if duration_s:
        summary["duration_s"] = duration_s
        summary["request_throughput"] = len(good) / duration_s
        summary["input_tokens_per_s"] = summary["input_tokens"] / duration_s
        summary["total_output_tokens_per_s"] = summary["output_tokens"] / duration_s
        summary["total_tokens_per_s"] = (summary["input_tokens"] + summary["output_tokens"]) / duration_s
    if slo:
        met = sum(1 for s, f in zip(good, figures) if meets_slo(s, f, slo))
        summary["slo"] = dict(slo)
        summary["slo_met"] = met
        summary["slo_attainment"] = (met / float(len(samples))) if samples else None
        if duration_s:
            summary["goodput_request_per_s"] = met / duration_s
    errors = [s.get("error") for s in samples if not s.get("ok")]
    if errors:
        summary["first_error"] = errors[0]
    return summary
