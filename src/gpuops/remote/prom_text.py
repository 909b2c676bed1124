"""An SGLang ``/metrics`` page (Prometheus text exposition format 0.0.4), summarised, and the deltas
of a bench run between two summaries (stdlib only, Python 3.8+; pure: the bench client on the host
summarises, the client at home takes the deltas).

A page holds ~170 ``sglang:`` series, each per label set (``model_name``, ``tp_rank``, ...) and
histograms per bucket. The summary keeps, per series name: counters and histogram ``_sum`` /
``_count`` summed over label sets, gauges averaged over them, and ``sglang:cuda_graph_passes_total``
split by its ``mode`` label (``decode_cuda_graph``, ``decode_none``, ``prefill_cuda_graph``,
``prefill_none``: ``metrics_collector.increment_*_cuda_graph_pass``). Buckets are dropped.

The deltas that matter for a bench run (``run_deltas``): speculative verify calls and the accept
length, CUDA-graph vs. eager decode passes, mean queue time, time to first token, tokens and
requests; each from the series the 0.5.23 source names (``srt/observability/metrics_collector.py``).
"""

import re

PREFIX = "sglang:"
_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_BY_LABEL = {"sglang:cuda_graph_passes_total": "mode"}


def parse(text, prefix=PREFIX):
    """(types, samples): ``{family: type}`` from ``# TYPE`` lines and a list of
    ``(name, {label: value}, float)`` for every sample whose name starts with ``prefix``."""
    types = {}
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        match = _SAMPLE.match(line)
        if not match or not match.group("name").startswith(prefix):
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        samples.append((match.group("name"), labels, value))
    return types, samples


def _family(name, types):
    for suffix in ("_bucket", "_sum", "_count", "_created", "_total"):
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)], suffix
    return name, ""


def summarise(text, prefix=PREFIX):
    """``{"values": {series: float}, "types": {series: type}, "series": N}`` (see the module's
    docstring for what is summed and what averaged)."""
    types, samples = parse(text, prefix)
    sums = {}
    counts = {}
    kinds = {}
    for name, labels, value in samples:
        family, suffix = _family(name, types)
        kind = types.get(family) or types.get(name) or "untyped"
        if suffix in ("_bucket", "_created") or name.endswith("_created"):
            continue
        key = name
        by = _BY_LABEL.get(name)
        if by and labels.get(by):
            key = "%s{%s=%s}" % (name, by, labels[by])
        sums[key] = sums.get(key, 0.0) + value
        counts[key] = counts.get(key, 0) + 1
        kinds[key] = "gauge" if kind == "gauge" else ("counter" if kind in ("counter", "histogram", "summary")
                                                     else kind)
    values = {}
    for key, total in sums.items():
        values[key] = total / counts[key] if kinds[key] == "gauge" else total
    return {"values": values, "types": kinds, "series": len(set(n for n, _, _ in samples))}


def _delta(before, after, key):
    if key not in after:
        return None
    return after[key] - (before.get(key) or 0.0)


def _mean(before, after, family):
    total, count = _delta(before, after, family + "_sum"), _delta(before, after, family + "_count")
    if total is None or not count:
        return None
    return total / count


def run_deltas(before, after):
    """What a bench run did on the server, from the summaries before and after it (None where the
    server did not report a series): a dict of plain numbers."""
    if not before or not after:
        return None
    b, a = before.get("values") or {}, after.get("values") or {}
    graph = _delta(b, a, "sglang:cuda_graph_passes_total{mode=decode_cuda_graph}")
    eager = _delta(b, a, "sglang:cuda_graph_passes_total{mode=decode_none}")
    if (graph is None) != (eager is None):  # a label set never counted is not exported: it is 0
        graph, eager = graph or 0.0, eager or 0.0
    verify = _delta(b, a, "sglang:spec_verify_calls_total")
    tokens = _delta(b, a, "sglang:generation_tokens_total")
    out = {
        "requests": _delta(b, a, "sglang:num_requests_total"),
        "prompt_tokens": _delta(b, a, "sglang:prompt_tokens_total"),
        "generation_tokens": tokens,
        "spec_verify_calls": verify,
        "spec_accept_length": a.get("sglang:spec_accept_length"),
        # accepted / proposed draft tokens, SGLang's gauge (0.5.8-0.5.23 metrics_collector.py)
        "spec_accept_rate": a.get("sglang:spec_accept_rate"),
        # tokens per verify call over the run: the accept length the run itself saw
        "tokens_per_verify": (tokens / verify) if tokens is not None and verify else None,
        "decode_cuda_graph_passes": graph,
        "decode_eager_passes": eager,
        "cuda_graph_share": (graph / (graph + eager)) if graph is not None and eager is not None and graph + eager
        else None,
        "queue_time_mean_s": _mean(b, a, "sglang:queue_time_seconds"),
        "ttft_mean_s": _mean(b, a, "sglang:time_to_first_token_seconds"),
        "itl_mean_s": _mean(b, a, "sglang:inter_token_latency_seconds"),
    }
    return out
