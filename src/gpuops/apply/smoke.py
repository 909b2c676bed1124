"""Correctness smoke check around a restart that changes kernels: the same greedy prompts, before and after.

Greedy decoding (temperature 0) of a few short prompts is deterministic for one build of the server
on one host, so a kernel change that alters numerics enough to change the argmax shows up as a
different answer. Equal answers prove little; different ones are worth a warning (and, with
``-e smoke_rollback=true``, a rollback). The prompts are sent from the host itself (one small exec
over the same SSH connection, ``remote/smoke_prompts.py`` through the one server client), to the
port the role's service answers on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping
from gpuops import shipping
from gpuops.apply.txn import number_var

if TYPE_CHECKING:
    from gpuops.transport import Connection

# Roles whose changes touch kernels: their restarts get the check.
KERNEL_ROLES = ("fusion-sm120", "pcie-allreduce")
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "List the first five prime numbers:",
)
MAX_TOKENS = 16
# ``gpuops_smoke_timeout``: how long one prompt may take. A real server's first answer after a
# restart can take minutes (kernels compiled, graphs captured on first use); the lease does not
# run out meanwhile (gpuops heartbeats from its own thread), so the default is generous.
DEFAULT_TIMEOUT_S = 600.0



@dataclass
class SmokeResult:
    """The server's greedy answers to ``PROMPTS``, in order, or why none came back (``outputs`` None)."""

    outputs: list[str] | None
    error: str | None = None


def wanted(role: str, variables: Mapping[str, Any]) -> bool:
    """On by default for kernel roles (``-e smoke_check=false`` turns it off); other roles on request
    (``tune`` asks for it on its nccl-env trials)."""
    return truthy(variables.get("smoke_check", role in KERNEL_ROLES))


def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def timeout_s(variables: Mapping[str, Any]) -> float:
    """``gpuops_smoke_timeout`` (seconds, >= 1; default 600): one prompt's time limit."""

    return number_var(variables, "gpuops_smoke_timeout", DEFAULT_TIMEOUT_S, float, "a number of seconds", 1, " second")


def run_prompts(conn: "Connection", port: int, python: str = "python3",
                timeout: float = DEFAULT_TIMEOUT_S) -> SmokeResult:
    # On the host, through the one server client (remote/smoke_prompts.py, remote/sglang_server.py).
    command = shipping.python_command(python)
    stdin = shipping.python_stdin("smoke_prompts", {"port": int(port), "max_tokens": MAX_TOKENS, "prompts": list(PROMPTS),
                                                  "timeout": float(timeout)})
    try:
        done = conn.run(command, stdin=stdin, timeout=timeout * len(PROMPTS) + 30)
    except Exception as exc:  # a transport error: the check is skipped, never the apply failed by it
        return SmokeResult(None, f"{type(exc).__name__}: {exc}")
    lines = (done.stdout or b"").decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        return SmokeResult(None, f"the prompt script printed nothing readable (rc {done.exit_status})")
    if answer.get("error"):
        error = str(answer["error"])
        return SmokeResult(None, error + (f" (gpuops_smoke_timeout={timeout:g} s)" if "timed out" in error else ""))
    return SmokeResult([str(o) for o in answer.get("outputs") or []])


def differences(before: list[str], after: list[str]) -> list[str]:
    """One line per prompt whose greedy answer changed (prompts are ours, so they can be shown)."""
    lines = []
    for prompt, old, new in zip(PROMPTS, before, after):
        if old != new:
            lines.append(f"{prompt!r}: {old[:40]!r} -> {new[:40]!r}")
    return lines
