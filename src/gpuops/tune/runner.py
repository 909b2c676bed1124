"""The I/O half of a sweep: for each variant, apply it (the nccl-env role), benchmark, and at the end
put every host back exactly as it was.

Safety comes from the apply engine, not from here: a variant whose server does not come back
healthy is rolled back by that apply run itself (files restored, previous server restarted), so
the sweep records it as failed and goes on. Every variant that changed a host is a journaled run;
at the end those runs are rolled back newest first, so the host ends byte for byte as it started
(or, with ``keep="best"``, the best variant is then applied as one ordinary, undoable run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuops.tune.sweep import BASELINE, Trial, Variant, best_variant
from gpuops.remote.host_protocol import STATUS_ROLLED_BACK

if TYPE_CHECKING:
    from gpuops.apply.host_report import HostReport
    from gpuops.apply.options import ApplyOptions
    from gpuops.bench.options import BenchOptions
    from gpuops.bench.store import ResultsStore
    from gpuops.inventory import Host

ROLE = "nccl-env"


@dataclass
class SweepOutcome:
    trials: dict[str, list[Trial]] = field(default_factory=dict)  # host -> trials in the order run
    restore_errors: dict[str, str] = field(default_factory=dict)  # host -> why it could not be put back
    kept: dict[str, str] = field(default_factory=dict)  # host -> variant left applied (keep="best")
    interrupted: bool = False


def _bench(hosts: Sequence[Host], options: BenchOptions, store: ResultsStore, apply_options: ApplyOptions,
           variant: str, env: dict[str, str], run_id: str | None) -> list[Trial]:
    from gpuops.bench.results import headline
    from gpuops.bench.runner import run_bench, targets_for

    states = run_bench(targets_for(hosts, None, None, True), options, store, apply_options.connect, remote=True)
    trials = []
    for name, state in states.items():
        line = headline(state.result) if state.result else {}
        ok = bool(line.get("ok")) and state.error is None and state.file is not None
        from gpuops.bench.repeats import result_intervals
        from gpuops.bench.stats import Interval

        interval = Interval.from_json(result_intervals(state.result).get("output tokens/s (per stream)")) \
            if ok and state.result else None
        trials.append(Trial(
            host=name, variant=variant, env=env, status="measured" if ok else "bench_failed",
            output_tokens_per_s=line.get("output_tokens_per_s") if ok else None, ttft_ms=line.get("ttft_ms"),
            itl_ms=line.get("itl_ms") or {}, result_id=line.get("result_id") if ok else None, run_id=run_id,
            error=None if ok else (state.error or "no result"), interval=interval,
            speed_model=(line.get("speed_model") or "unrecorded") if line.get("simulated") else None,
        ))
    return trials


def _failed_apply(report: HostReport, variant: Variant) -> Trial:
    why = report.error or report.status
    if report.status == STATUS_ROLLED_BACK:
        why = f"{why} (rolled back: the host runs its previous configuration)"
    return Trial(host=report.host, variant=variant.label, env=dict(variant.env), status="apply_failed",
                 run_id=report.run_id, error=why, log_tail=report.log_tail)


def run_sweep(
    hosts: Sequence[Host],
    variants: Sequence[Variant],
    bench_options: BenchOptions,
    store: ResultsStore,
    apply_options: ApplyOptions,
    keep: str = "original",
    say: Callable[[str], None] = lambda line: None,
) -> SweepOutcome:
    from gpuops.apply.runner import apply_role, rollback_hosts

    outcome = SweepOutcome(trials={h.name: [] for h in hosts})
    by_name = {h.name: h for h in hosts}
    applied_runs: list[tuple[str, list[str]]] = []  # (run id, hosts it changed), oldest first
    try:
        say(f"tune: measuring the {BASELINE}")
        for trial in _bench(hosts, bench_options, store, apply_options, BASELINE, {}, None):
            outcome.trials[trial.host].append(trial)
        import time

        started = time.monotonic()
        for index, variant in enumerate(variants):
            # progress: which variant of how many, and an ETA from the variants done so far
            eta = ""
            if index:
                per = (time.monotonic() - started) / index
                eta = f", ETA {per * (len(variants) - index):.0f} s"
            say(f"tune: applying {variant.label} (variant {index + 1}/{len(variants)}{eta})")
            # smoke_check: greedy prompts before and after each restart; a variant that changes the
            # answers is said here (the trial still runs: speed and correctness are reported apart)
            run_id, reports = apply_role(hosts, ROLE, {"nccl_env": dict(variant.env), "smoke_check": True},
                                         apply_options)
            for name, report in reports.items():
                for warning in report.warnings:
                    if warning.startswith("smoke check"):
                        say(f"tune: {name}: {variant.label}: WARNING {warning}")
            changed = [name for name, r in reports.items() if r.ok and r.changed]
            if changed:
                applied_runs.append((run_id, changed))
            ready = [by_name[name] for name, r in reports.items() if r.ok]
            for name, report in reports.items():
                if not report.ok:
                    outcome.trials[name].append(_failed_apply(report, variant))
            if ready:
                say(f"tune: benchmarking {variant.label} on {len(ready)} host(s)")
                for trial in _bench(ready, bench_options, store, apply_options, variant.label, dict(variant.env), run_id):
                    outcome.trials[trial.host].append(trial)
    except KeyboardInterrupt:
        outcome.interrupted = True
        say("tune: interrupted; putting the hosts back")
    finally:
        _restore(applied_runs, by_name, apply_options, outcome, say, rollback_hosts)
    if keep == "best" and not outcome.interrupted:
        _keep_best(hosts, variants, apply_options, outcome, say, apply_role)
    return outcome


def _restore(applied_runs: list[tuple[str, list[str]]], by_name: dict[str, Host], apply_options: ApplyOptions,
             outcome: SweepOutcome, say: Callable[[str], None], rollback_hosts: Callable[..., Any]) -> None:
    """Undo every run the sweep made, newest first: the hosts end as they started."""
    for run_id, names in reversed(applied_runs):
        targets = [by_name[n] for n in names if n not in outcome.restore_errors]
        if not targets:
            continue
        say(f"tune: rolling back {run_id} on {len(targets)} host(s)")
        for name, report in rollback_hosts(targets, run_id, apply_options).items():
            if not report.ok:
                outcome.restore_errors[name] = f"rollback of {run_id} failed: {report.error}"


def _keep_best(hosts: Sequence[Host], variants: Sequence[Variant], apply_options: ApplyOptions,
               outcome: SweepOutcome, say: Callable[[str], None], apply_role: Callable[..., Any]) -> None:
    by_label = {v.label: v for v in variants}
    groups: dict[str, list[Host]] = {}
    for host in hosts:
        best = best_variant(outcome.trials[host.name])
        if best is None or best.variant == BASELINE or host.name in outcome.restore_errors:
            continue
        groups.setdefault(best.variant, []).append(host)
    for label, group in groups.items():
        say(f"tune: keeping {label} on {len(group)} host(s)")
        _, reports = apply_role(group, ROLE, {"nccl_env": dict(by_label[label].env)}, apply_options)
        for name, report in reports.items():
            if report.ok:
                outcome.kept[name] = label
            else:
                outcome.restore_errors[name] = f"applying the best variant failed: {report.error}"
