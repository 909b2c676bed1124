"""Each command's time limit per host when ``--timeout`` is not given (docs/time-limits.md).

Before, apply, rollback, history, bench and tune had none: a host that never answered (a FIFO in
the SGLang tree, a stalled SSH session) held gpuops for good. Each default sits above what the
command legitimately waits for with the default run variables, so that it only ends what hangs;
a host over its limit ends as ``--timeout`` promises (failed, its outcome said or its run rolled
back by the host itself) while the other hosts carry on.
"""

from __future__ import annotations

# inspect, advise: one gather (the gate scan of a large tree is seconds).
INSPECT_S = 120.0
# history: the journal, and first the rollback of a run that died (a restart of the previous server,
# whose health wait is gpuops_health_timeout, 1200 s, would take the rest).
HISTORY_S = 600.0
# rollback: a restart and its health wait (1200 s), the smoke check's prompts (600 s each).
ROLLBACK_S = 3600.0
# apply (and each step of tune): sglang-release builds the release's environment on the host first
# (that step's own limit: 7200 s), then the same restart, health and smoke check as a rollback.
APPLY_S = 10800.0
# bench --remote (and profile): a suite with --repeat, its requests each limited by --request-timeout.
BENCH_S = 7200.0

DEFAULTS = {"inspect": INSPECT_S, "advise": INSPECT_S, "history": HISTORY_S, "rollback": ROLLBACK_S,
            "apply": APPLY_S, "tune": APPLY_S, "bench": BENCH_S, "profile": BENCH_S}


def per_host(command: str, given: float | None) -> float:
    """``--timeout`` as given, else the command's default."""
    return given if given is not None else DEFAULTS[command]

