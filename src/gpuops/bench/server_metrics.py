"""The server's own account of a bench run (its ``/metrics`` deltas, ``remote/prom_text.run_deltas``)
in one line for ``gpuops bench`` (pure)."""

from __future__ import annotations

from gpuops.bench.record import figure, mapping


def metrics_line(given: object) -> str | None:
    """``requests 8, tokens 512, verify calls 200 (2.56 tokens each; accept length 2.5), CUDA-graph
    decode 98% (eager 4), queue 1.2 ms, TTFT 40.1 ms``; None when the server reported nothing."""
    deltas = mapping(given)
    if not deltas:
        return None

    def at(key: str) -> float | None:
        """A delta as ``run_deltas`` gives it: a plain number, or None where the server had no series."""
        return figure(deltas.get(key))

    parts = []
    requests, tokens, verify_calls = at("requests"), at("generation_tokens"), at("spec_verify_calls")
    if requests is not None:
        parts.append(f"requests {requests:g}")
    if tokens is not None:
        parts.append(f"tokens {tokens:g}")
    if verify_calls is not None:
        per_verify, accept_length = at("tokens_per_verify"), at("spec_accept_length")
        each = f"{per_verify:.2f} tokens each" if per_verify else ""
        accept = f"accept length {accept_length:.2f}" if accept_length is not None else ""
        inner = "; ".join(p for p in (each, accept) if p)
        parts.append(f"verify calls {verify_calls:g}" + (f" ({inner})" if inner else ""))
    graph_share, graph_passes = at("cuda_graph_share"), at("decode_cuda_graph_passes")
    if graph_share is not None:
        parts.append(f"CUDA-graph decode {graph_share * 100:.0f}% (eager {deltas.get('decode_eager_passes'):g})")
    elif graph_passes is not None:
        parts.append(f"CUDA-graph decode passes {graph_passes:g}")
    queue, ttft = at("queue_time_mean_s"), at("ttft_mean_s")
    if queue is not None:
        parts.append(f"queue {queue * 1000:.1f} ms")
    if ttft is not None:
        parts.append(f"TTFT {ttft * 1000:.1f} ms")
    return ", ".join(parts) or None
