"""The /metrics deltas of a bench run, parsed from real Prometheus text: pages written by the real
``prometheus_client`` library (what SGLang's metrics collector uses) with the series SGLang 0.5.23
declares (``srt/observability/metrics_collector.py``: names, types, the ``mode`` label)."""

from __future__ import annotations

import pytest

from gpuops.remote import prom_text

LABELS = {"model_name": "kimi", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}


def _collector():
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # a test extra (pyproject [test])

    registry = CollectorRegistry()
    names = list(LABELS)
    m = {
        "verify": Counter("sglang:spec_verify_calls_total", "verify calls", names, registry=registry),
        "accept": Gauge("sglang:spec_accept_length", "accept length", names, registry=registry),
        "graph": Counter("sglang:cuda_graph_passes_total", "passes", names + ["mode"], registry=registry),
        "queue": Histogram("sglang:queue_time_seconds", "queue", names, registry=registry, buckets=[0.001, 0.01, 0.1, 1]),
        "ttft": Histogram("sglang:time_to_first_token_seconds", "ttft", names, registry=registry, buckets=[0.1, 1]),
        "gen": Counter("sglang:generation_tokens_total", "tokens", names, registry=registry),
        "reqs": Counter("sglang:num_requests_total", "requests", names, registry=registry),
        "running": Gauge("sglang:num_running_reqs", "running", names, registry=registry),
        "other": Gauge("vllm:not_ours", "not sglang", registry=registry),
    }
    return registry, m


def test_deltas_of_a_run_from_two_real_pages() -> None:
    from prometheus_client import generate_latest

    registry, m = _collector()
    m["verify"].labels(**LABELS).inc(100)
    m["graph"].labels(**LABELS, mode="decode_cuda_graph").inc(50)
    m["gen"].labels(**LABELS).inc(1000)
    m["queue"].labels(**LABELS).observe(0.5)
    before = prom_text.summarise(generate_latest(registry).decode())

    m["verify"].labels(**LABELS).inc(40)
    m["graph"].labels(**LABELS, mode="decode_cuda_graph").inc(30)
    m["graph"].labels(**LABELS, mode="decode_none").inc(10)
    m["graph"].labels(**LABELS, mode="prefill_none").inc(4)
    m["gen"].labels(**LABELS).inc(100)
    m["reqs"].labels(**LABELS).inc(4)
    m["accept"].labels(**LABELS).set(2.5)
    for seconds in (0.002, 0.004, 0.006, 0.008):
        m["queue"].labels(**LABELS).observe(seconds)
        m["ttft"].labels(**LABELS).observe(seconds * 10)
    m["running"].labels(**LABELS).set(3)
    after = prom_text.summarise(generate_latest(registry).decode())

    assert "vllm:not_ours" not in after["values"]
    assert after["values"]["sglang:num_running_reqs"] == 3
    d = prom_text.run_deltas(before, after)
    assert d["spec_verify_calls"] == 40 and d["generation_tokens"] == 100 and d["requests"] == 4
    assert d["tokens_per_verify"] == pytest.approx(2.5) and d["spec_accept_length"] == 2.5
    assert d["decode_cuda_graph_passes"] == 30 and d["decode_eager_passes"] == 10
    assert d["cuda_graph_share"] == pytest.approx(0.75)
    assert d["queue_time_mean_s"] == pytest.approx(0.005)  # the run's four, not the earlier 0.5 s
    assert d["ttft_mean_s"] == pytest.approx(0.05)


def test_counters_sum_over_ranks_and_gauges_average() -> None:
    page = "\n".join([
        "# TYPE sglang:generation_tokens_total counter",
        'sglang:generation_tokens_total{tp_rank="0"} 10.0',
        'sglang:generation_tokens_total{tp_rank="1"} 30.0',
        "# TYPE sglang:spec_accept_length gauge",
        'sglang:spec_accept_length{dp_rank="0"} 2.0',
        'sglang:spec_accept_length{dp_rank="1"} 3.0',
        "garbage line that is not a sample {",
    ])
    values = prom_text.summarise(page)["values"]
    assert values == {"sglang:generation_tokens_total": 40.0, "sglang:spec_accept_length": 2.5}
    assert prom_text.run_deltas(None, {"values": values}) is None


def test_the_bench_line_says_what_the_server_did() -> None:
    from gpuops.bench.server_metrics import metrics_line

    deltas = {"requests": 4, "generation_tokens": 100, "spec_verify_calls": 40, "tokens_per_verify": 2.5,
              "spec_accept_length": 2.4, "decode_cuda_graph_passes": 30, "decode_eager_passes": 10,
              "cuda_graph_share": 0.75, "queue_time_mean_s": 0.005, "ttft_mean_s": 0.05}
    assert metrics_line(deltas) == ("requests 4, tokens 100, verify calls 40 (2.50 tokens each; accept length 2.40), "
                                    "CUDA-graph decode 75% (eager 10), queue 5.0 ms, TTFT 50.0 ms")
    assert metrics_line(None) is None and metrics_line({}) is None


def test_a_mode_never_counted_is_zero() -> None:
    page = ("# TYPE sglang:cuda_graph_passes_total counter\n"
            'sglang:cuda_graph_passes_total{mode="decode_cuda_graph"} %s\n')
    d = prom_text.run_deltas(prom_text.summarise(page % 10), prom_text.summarise(page % 30))
    assert d["decode_cuda_graph_passes"] == 20 and d["decode_eager_passes"] == 0 and d["cuda_graph_share"] == 1.0
