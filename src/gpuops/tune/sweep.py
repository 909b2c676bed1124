"""The pure half of a sweep: which variants to try, and how to rank what they measured.

A variant is one NCCL environment (``NCCL_ALGO=Ring NCCL_PROTO=LL``), the cross product of the
``--sweep`` axes. Every name and value is checked against NCCL's own vocabulary before any host is
touched, so a typo never costs a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuops.bench.stats import Interval, significant
from gpuops.errors import GpuopsError

BASELINE = "baseline (as configured)"


@dataclass(frozen=True)
class Variant:
    label: str
    env: Mapping[str, str]
    warnings: tuple[str, ...] = ()


@dataclass
class Trial:
    """What one variant did on one host."""

    host: str
    variant: str
    env: Mapping[str, str]
    status: str  # measured | apply_failed | bench_failed
    output_tokens_per_s: float | None = None
    ttft_ms: float | None = None
    itl_ms: Mapping[str, float | None] = field(default_factory=dict)
    result_id: str | None = None
    run_id: str | None = None
    error: str | None = None
    interval: Interval | None = None  # 95% bootstrap interval of output tokens/s (see gpuops.bench.stats)
    speed_model: str | None = None  # from a stand-in server: its model's label (the figures are simulated)
    log_tail: str | None = None  # the server's log after a variant's failed start (host text, redacted)

    @property
    def ok(self) -> bool:
        return self.status == "measured" and self.output_tokens_per_s is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant, "env": dict(self.env), "ok": self.ok, "status": self.status,
            "output_tokens_per_s": self.output_tokens_per_s, "ttft_ms": self.ttft_ms, "itl_ms": dict(self.itl_ms),
            "result_id": self.result_id, "apply_run_id": self.run_id, "error": self.error,
            "interval": self.interval.as_json() if self.interval else None,
            "simulated": self.speed_model is not None, "speed_model": self.speed_model,
            "log_tail": self.log_tail,
        }


def label_of(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items()) or BASELINE


def plan_variants(sweeps: Sequence[str], launch_args: Sequence[str] = ()) -> list[Variant]:
    """``["NCCL_ALGO=Ring,Tree", "NCCL_PROTO=LL,Simple"]`` -> 4 checked variants, in a stable order."""
    from gpuops.bench.options import expand_env_variants
    from gpuops.nccl import check_nccl_env, nccl_warnings

    if not sweeps:
        raise GpuopsError("tune: give at least one --sweep NCCL_NAME=VALUE[,VALUE...]")
    try:
        combos = expand_env_variants(list(sweeps))
    except GpuopsError as exc:
        raise GpuopsError(str(exc).replace("bench: --env", "tune: --sweep")) from exc
    variants: list[Variant] = []
    for combo in combos:
        env = dict(combo)
        for name in env:
            if not name.startswith("NCCL_"):
                raise GpuopsError(f"tune: --sweep {name}: only NCCL_* variables are swept (the nccl-env role)")
        check_nccl_env(env, "tune --sweep")
        variants.append(Variant(label_of(env), env, tuple(nccl_warnings(env, list(launch_args)))))
    return variants


def rank(trials: Iterable[Trial]) -> list[Trial]:
    """Fastest first by output tokens/s (ties: lower TTFT); failures last, in the order they ran."""
    trials = list(trials)
    measured = sorted((t for t in trials if t.ok), key=lambda t: (-(t.output_tokens_per_s or 0.0), t.ttft_ms or 0.0))
    return measured + [t for t in trials if not t.ok]


def verdicts(trials: Iterable[Trial]) -> dict[str, str]:
    """Per measured variant, against the fastest: 'fastest', 'indistinguishable' (intervals overlap,
    or one has none) or 'slower' (intervals apart): the same rule as ``results compare``."""
    ranked = [t for t in rank(trials) if t.ok]
    if not ranked:
        return {}
    top = ranked[0]
    out = {top.variant: "fastest"}
    for trial in ranked[1:]:
        out[trial.variant] = "slower" if significant(top.interval, trial.interval) else "indistinguishable"
    return out


def best_variant(trials: Iterable[Trial]) -> Trial | None:
    """The fastest variant, but only when it beats the baseline beyond noise; else the baseline.

    A variant whose interval overlaps the baseline's (or that has no interval) is no reason to
    change a host. Without a measured baseline the fastest measured variant wins.
    """
    trials = list(trials)
    ranked = rank(trials)
    if not ranked or not ranked[0].ok:
        return None
    top = ranked[0]
    baseline = next((t for t in trials if t.variant == BASELINE and t.ok), None)
    if baseline is None or top is baseline or significant(baseline.interval, top.interval):
        return top
    return baseline
