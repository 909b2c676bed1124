"""How long a real SGLang server takes, for the lab's stand-in to take as long (``lab up --timing real``).

Measured on the lent H200 with SGLang 0.5.16 and a 45 M-parameter model (the recipe in
benchmarks/device/real_sglang; the answers in tests/fixtures/real/h200-x1/sglang-0.5.16):
- the port opens 58 s after the launch with warm caches, healthy 2 s later (the first start
  through gpuops, call 1's managed-server.log: 02:09:01 -> 02:09:59 -> 02:10:01); with cold caches
  123 s, then 14 s (Python imports ~50 s, decode CUDA-graph capture 67 s instead of 1.8 s);
- every healthy ``/health`` takes ~1.0 s (0.5.16 runs a 1-token generation, then sleeps 1 s);
- SIGTERM: "Draining requests and shutting down", ~5 s, then every process is gone.
A large model adds its weight loading (minutes) to the start: these are the least a real start takes.
The default (``fast``) keeps each at zero, for rehearsals and tests that ask for speed.
"""

from __future__ import annotations

TIMINGS = ("fast", "real")

# The warm start (58 s to the port, healthy at 60 s: STARTUP_S counts from the launch), the
# /health time and the drain.
REAL_0516_H200 = {
    "GPUOPS_STANDIN_LISTEN_AFTER_S": "58",
    "GPUOPS_STANDIN_STARTUP_S": "60",
    "GPUOPS_STANDIN_HEALTH_S": "1.0",
    "GPUOPS_STANDIN_DRAIN_S": "5",
}


def standin_env(timing: str) -> dict[str, str]:
    """The stand-in's environment for ``timing`` (``fast``: none; ``real``: REAL_0516_H200)."""
    return dict(REAL_0516_H200) if timing == "real" else {}
