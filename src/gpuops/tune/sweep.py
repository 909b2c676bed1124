"""The pure half of a sweep: which variants to try, and how to rank what they measured.

A variant is one setting of every ``--sweep`` axis: NCCL environment variables (``NCCL_ALGO=Ring``)
and SGLang launch flags (``speculative_num_steps=3``), by default their cross product (``--grid``),
or with ``--one-at-a-time`` each axis moved alone from the first value of every other. NCCL names and
values are checked against NCCL's own vocabulary here; launch flags against each host's release
(``tune/flags.py``) before any host is touched, so a typo never costs a restart.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

from gpuops.bench.stats import Interval, significant
from gpuops.errors import GpuopsError
from gpuops.tune.flags import ReleaseFlags, is_speculative, launch_words
from gpuops.nccl import check_nccl_env, nccl_warnings
from gpuops.frozen import frozen

BASELINE = "baseline (as configured)"
SPEC_OFF = "speculation off"  # the server as configured with its speculative flags taken out
GRID, ONE_AT_A_TIME = "grid", "one-at-a-time"
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_FLAG_NAME = re.compile(r"^(--)?[a-z][a-z0-9_-]*$")


@frozen
class Variant:
    """One setting of every ``--sweep`` axis: the NCCL environment and SGLang launch flags it applies (or takes
    out), with its label and NCCL's warnings."""

    label: str
    env: Mapping[str, str]
    warnings: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)  # launch flag (as given) -> value
    launch: tuple[str, ...] = ()  # the launch words the flags add, once checked against the releases
    drop: tuple[str, ...] = ()  # launch flags of the inventory's that the variant takes out (speculation off)

    @property
    def speculative(self) -> bool:
        return any(is_speculative(name) for name in self.flags)


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
    flags: Mapping[str, str] = field(default_factory=dict)
    accept_length: float | None = None  # tokens per verify step, as the server reports it
    accept_rate: float | None = None    # accepted / proposed draft tokens (/metrics sglang:spec_accept_rate)
    speculative: bool | None = None     # whether the server ran speculative decoding (its resolved settings)
    levels: tuple[Mapping[str, object], ...] = ()  # --concurrency: the serving suite's figures per level
    levels_result_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "measured" and self.output_tokens_per_s is not None

    def to_json(self) -> dict[str, object]:
        return {
            "variant": self.variant, "env": dict(self.env), "flags": dict(self.flags), "ok": self.ok,
            "status": self.status,
            "output_tokens_per_s": self.output_tokens_per_s, "ttft_ms": self.ttft_ms, "itl_ms": dict(self.itl_ms),
            "accept_length": self.accept_length, "accept_rate": self.accept_rate, "speculative": self.speculative,
            "result_id": self.result_id, "apply_run_id": self.run_id, "error": self.error,
            "interval": self.interval.as_json() if self.interval else None,
            "simulated": self.speed_model is not None, "speed_model": self.speed_model,
            "log_tail": self.log_tail, "levels": [dict(lv) for lv in self.levels],
            "levels_result_id": self.levels_result_id,
        }


def label_of(env: Mapping[str, str], flags: Mapping[str, str] | None = None) -> str:
    return " ".join(f"{k}={v}" for k, v in [*(flags or {}).items(), *env.items()]) or BASELINE


def _axes(sweeps: Sequence[str]) -> list[tuple[str, list[str]]]:
    axes: list[tuple[str, list[str]]] = []
    for spec in sweeps:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not (_ENV_NAME.match(name) or _FLAG_NAME.match(name)):
            raise GpuopsError(f"tune: --sweep {spec!r} is not NAME=VALUE[,VALUE...] (an NCCL_* variable or an "
                              "SGLang launch flag such as speculative_num_steps)")
        key = name if _ENV_NAME.match(name) else name.lstrip("-").replace("-", "_")
        if key in [k if _ENV_NAME.match(k) else k.lstrip("-").replace("-", "_") for k, _ in axes]:
            raise GpuopsError(f"tune: --sweep {name} given twice; list its values once, comma-separated")
        options = [v.strip() for v in values.split(",")]
        if any(not v or not v.isprintable() for v in options):
            raise GpuopsError(f"tune: --sweep {spec!r} has an empty or unprintable value")
        if _ENV_NAME.match(name) and not name.startswith("NCCL_"):
            raise GpuopsError(f"tune: --sweep {name}: only NCCL_* variables are swept (the nccl-env role); "
                              "launch flags are written in lower case (speculative_num_steps=3)")
        axes.append((name, list(dict.fromkeys(options))))
    return axes


def _combos(axes: list[tuple[str, list[str]]], mode: str) -> list[list[tuple[str, str]]]:
    if mode == ONE_AT_A_TIME:
        reference = [(name, values[0]) for name, values in axes]
        combos = [reference]
        for i, (name, values) in enumerate(axes):
            combos.extend(reference[:i] + [(name, v)] + reference[i + 1:] for v in values[1:])
        return combos
    return [list(c) for c in itertools.product(*[[(name, v) for v in values] for name, values in axes])]


def plan_variants(sweeps: Sequence[str], launch_args: Sequence[str] = (), mode: str = GRID) -> list[Variant]:
    """``["NCCL_ALGO=Ring,Tree", "speculative_num_steps=1,3"]`` -> 4 variants, in a stable order (the
    cross product; ``mode="one-at-a-time"``: the first values, then each axis moved alone). NCCL
    settings are checked here; launch flags by ``check_flags`` against each host's release."""

    if not sweeps:
        raise GpuopsError("tune: give at least one --sweep NAME=VALUE[,VALUE...]")
    variants: list[Variant] = []
    for combo in _combos(_axes(sweeps), mode):
        env = {k: v for k, v in combo if _ENV_NAME.match(k)}
        flags = {k: v for k, v in combo if not _ENV_NAME.match(k)}
        check_nccl_env(env, "tune --sweep")
        variants.append(Variant(label_of(env, flags), env, tuple(nccl_warnings(env, list(launch_args))), flags))
    return variants


def check_flags(variants: Sequence[Variant], releases: Sequence[ReleaseFlags]) -> list[Variant]:
    """Each variant's launch flags checked against every host's release (refused: one line naming
    what the release has), with the launch words they add. A sweep over speculative settings needs
    a server that runs without speculation (it is the baseline) and a variant that turns it on."""
    checked = []
    for variant in variants:
        words: tuple[str, ...] | None = None
        for release in releases:
            mine = tuple(w for name, value in variant.flags.items() for w in launch_words(release.check(name, value), value))
            if words is not None and mine != words:
                raise GpuopsError(f"tune: {release.host}: SGLang {release.version} spells {variant.label} as "
                                  f"{' '.join(mine)}, another host as {' '.join(words)}: tune them apart (-l)")
            words = mine
        checked.append(replace(variant, launch=words or ()))
    if any(v.speculative for v in variants):
        speculating = [r for r in releases if r.speculative]
        if speculating:  # the baseline speculates: speculation off is measured as a variant of its own
            drop = sorted({f for r in speculating for f in r.speculative_flags} or {"--speculative-algorithm"})
            checked.insert(0, Variant(SPEC_OFF, {}, drop=tuple(drop)))
        elif not any("speculative_algorithm" in {n.lstrip("-").replace("-", "_") for n in v.flags} for v in variants):
            raise GpuopsError("tune: the sweep sets speculative_* flags but no variant turns speculation on: "
                              "add --sweep speculative_algorithm=NAME (EAGLE3, NGRAM, ...)")
    return checked


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


class VersusBaseline(TypedDict):
    """One variant against the sweep's reference: ``faster`` | ``slower`` | ``within noise`` |
    ``reference``, and its tok/s over the reference's."""

    verdict: str
    ratio: float


def against_baseline(trials: Iterable[Trial]) -> dict[str, VersusBaseline]:
    """Per measured variant, against the reference: the run without speculation when the sweep
    measured one as a variant (the host as configured speculates), else the host as configured.
    ``{"verdict": faster | slower | within noise, "ratio": tok/s over the reference's}`` by the
    same rule as ``results compare`` (95% bootstrap intervals apart, else within noise); the
    reference itself is ``{"verdict": "reference", "ratio": 1.0}``."""
    trials = list(trials)
    baseline = next((t for t in trials if t.variant == SPEC_OFF and t.ok), None) or next(
        (t for t in trials if t.variant == BASELINE and t.ok), None)
    if baseline is None or not baseline.output_tokens_per_s:
        return {}
    out: dict[str, VersusBaseline] = {baseline.variant: {"verdict": "reference", "ratio": 1.0}}
    for trial in trials:
        if not trial.ok or trial is baseline:
            continue
        ratio = (trial.output_tokens_per_s or 0.0) / baseline.output_tokens_per_s
        apart = significant(baseline.interval, trial.interval)
        out[trial.variant] = {"verdict": ("faster" if ratio > 1 else "slower") if apart else "within noise",
                              "ratio": round(ratio, 4)}
    return out
