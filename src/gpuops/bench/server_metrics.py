"""The server's own account of a bench run (its ``/metrics`` deltas, ``remote/prom_text.run_deltas``)
in one line for ``gpuops bench`` (pure)."""

from __future__ import annotations

from typing import Any, Mapping


def metrics_line(deltas: Mapping[str, Any] | None) -> str | None:
    """``requests 8, tokens 512, verify calls 200 (2.56 tokens each; accept length 2.5), CUDA-graph
    decode 98% (eager 4), queue 1.2 ms, TTFT 40.1 ms``; None when the server reported nothing."""
    if not deltas:
        return None
    parts = []
    if deltas.get("requests") is not None:
        parts.append(f"requests {deltas['requests']:g}")
    if deltas.get("generation_tokens") is not None:
        parts.append(f"tokens {deltas['generation_tokens']:g}")
    if deltas.get("spec_verify_calls") is not None:
        each = f"{deltas['tokens_per_verify']:.2f} tokens each" if deltas.get("tokens_per_verify") else ""
        accept = (f"accept length {deltas['spec_accept_length']:.2f}" if deltas.get("spec_accept_length") is not None
                  else "")
        inner = "; ".join(p for p in (each, accept) if p)
        parts.append(f"verify calls {deltas['spec_verify_calls']:g}" + (f" ({inner})" if inner else ""))
    if deltas.get("cuda_graph_share") is not None:
        parts.append(f"CUDA-graph decode {deltas['cuda_graph_share'] * 100:.0f}% (eager {deltas['decode_eager_passes']:g})")
    elif deltas.get("decode_cuda_graph_passes") is not None:
        parts.append(f"CUDA-graph decode passes {deltas['decode_cuda_graph_passes']:g}")
    if deltas.get("queue_time_mean_s") is not None:
        parts.append(f"queue {deltas['queue_time_mean_s'] * 1000:.1f} ms")
    if deltas.get("ttft_mean_s") is not None:
        parts.append(f"TTFT {deltas['ttft_mean_s'] * 1000:.1f} ms")
    return ", ".join(parts) or None
