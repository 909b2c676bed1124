"""The I/O half of a sweep: read what each host's release accepts, then for each variant apply it
(the nccl-env role for NCCL variables alone, launch-flags when it sets SGLang launch flags),
benchmark, and at the end put every host back exactly as it was.

Safety comes from the apply engine, not from here: a variant whose server does not come back
healthy is rolled back by that apply run itself (files restored, previous server restarted), so
the sweep records it as failed and goes on. Every variant that changed a host is a journaled run;
at the end those runs are rolled back newest first, so the host ends byte for byte as it started
(or, with ``keep="best"``, the best variant is then applied as one ordinary, undoable run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuops import termination
from gpuops.apply.host_call import module_answer
from gpuops.errors import GpuopsError, TransportError
from gpuops.remote.host_protocol import STATUS_ROLLED_BACK
from gpuops.tune.flags import ReleaseFlags
from gpuops.tune.sweep import BASELINE, Trial, Variant, best_variant
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.runner import apply_role, rollback_hosts
from gpuops.bench.repeats import result_intervals
from gpuops.bench.record import Headline, figure, mapping
from gpuops.bench.results import headline
from gpuops.bench.runner import run_bench, targets_for
from gpuops.bench.stats import Interval
from gpuops import transport  # transport.connect looked up when called (tests replace it)
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.apply.host_report import HostReport
    from gpuops.apply.options import ApplyOptions
    from gpuops.bench.options import BenchOptions
    from gpuops.bench.store import ResultsStore
    from gpuops.inventory import Host

ROLE = "nccl-env"
FLAGS_ROLE = "launch-flags"
READ_TIMEOUT_S = 120.0  # reading a release's argument sources: ~1 s on a real 0.5.23 tree


@dataclass
class SweepOutcome:
    """What a sweep did, per host: the trials in the order run, why a host could not be put back, and the
    variant left applied; ``interrupted`` when Ctrl-C or SIGTERM ended it."""

    trials: dict[str, list[Trial]] = field(default_factory=dict)  # host -> trials in the order run
    restore_errors: dict[str, str] = field(default_factory=dict)  # host -> why it could not be put back
    kept: dict[str, str] = field(default_factory=dict)  # host -> variant left applied (keep="best")
    interrupted: bool = False


def read_releases(hosts: Sequence[Host], apply_options: ApplyOptions) -> list[ReleaseFlags]:
    """What each host's SGLang parser accepts, read on the host (``remote/sglang_flags.py``) from
    the release its server runs (or the inventory's python where none runs); nothing is changed."""
    releases = []
    for host in hosts:
        variables = host.vars
        env = variables.get("sglang_env")
        env = env if isinstance(env, dict) else {}
        port = str(variables.get("sglang_port") or 30000)
        payload = {"port": int(port) if port.isdigit() else 30000,
                   "python": str(variables.get("sglang_python") or "") or None,
                   "pythonpath": env.get("PYTHONPATH") if isinstance(env.get("PYTHONPATH"), str) else None}
        try:
            conn = transport.connect(host, apply_options.connect)
            try:
                answer = module_answer(conn, variables, "sglang_flags", payload, READ_TIMEOUT_S,
                                       f"tune: {host.name}: the flag reader")
            finally:
                conn.close()
        except TransportError as exc:  # a host that cannot be reached: one line, nothing changed anywhere
            raise GpuopsError(f"tune: {host.name}: cannot read its SGLang's flags: {exc}; nothing was changed") from None
        releases.append(ReleaseFlags.from_answer(host.name, answer))
    return releases


@frozen
class Speculation:
    """What a decode result says about speculation: the accept length per verify step (the server's
    /server_info internal state, else its /metrics), the acceptance rate (/metrics), and whether
    the server ran it (its resolved settings)."""

    accept_length: float | None
    accept_rate: float | None
    speculative: bool | None

    @classmethod
    def of(cls, line: Headline) -> Speculation:
        deltas = mapping(line.get("server_metrics"))
        accept = figure(line.get("accept_length"))
        if accept is None and deltas.get("spec_verify_calls"):
            accept = figure(deltas.get("spec_accept_length"))
        rate = figure(deltas.get("spec_accept_rate")) if deltas.get("spec_verify_calls") else None
        in_effect = mapping(line.get("speculative")).get("in_effect")
        speculative = in_effect if isinstance(in_effect, bool) else None
        return cls(accept if speculative is not False else None, rate if speculative is not False else None,
                   speculative)


def _bench(hosts: Sequence[Host], options: BenchOptions, store: ResultsStore, apply_options: ApplyOptions,
           variant: Variant | None, run_id: str | None, levels: BenchOptions | None = None) -> list[Trial]:
    label = variant.label if variant is not None else BASELINE
    env = dict(variant.env) if variant is not None else {}
    flags = dict(variant.flags) if variant is not None else {}
    states = run_bench(targets_for(hosts, None, None, True), options, store, apply_options.connect, remote=True)
    termination.raise_if_interrupted()  # the bench took Ctrl-C/SIGTERM as its stop: the sweep ends too
    serving = (run_bench(targets_for(hosts, None, None, True), levels, store, apply_options.connect, remote=True)
               if levels is not None else {})
    termination.raise_if_interrupted()  # the bench took Ctrl-C/SIGTERM as its stop: the sweep ends too
    trials = []
    for name, state in states.items():
        line: Headline = headline(state.result) if state.result else {}
        ok = bool(line.get("ok")) and state.error is None and state.file is not None
        interval = Interval.from_json(result_intervals(state.result).get("output tokens/s (per stream)")) \
            if ok and state.result else None
        more = serving.get(name)
        level_line: Headline = headline(more.result) if more is not None and more.result else {}
        speculation = Speculation.of(line)
        trials.append(Trial(
            host=name, variant=label, env=env, flags=flags, status="measured" if ok else "bench_failed",
            output_tokens_per_s=figure(line.get("output_tokens_per_s")) if ok else None,
            ttft_ms=figure(line.get("ttft_ms")),
            itl_ms={q: figure(v) for q, v in (line.get("itl_ms") or {}).items()},
            result_id=line.get("result_id") if ok else None, run_id=run_id,
            error=None if ok else (state.error or "no result"), interval=interval,
            speed_model=(line.get("speed_model") or "unrecorded") if line.get("simulated") else None,
            levels=tuple(level_line.get("levels") or ()), levels_result_id=level_line.get("result_id"),
            accept_length=speculation.accept_length, accept_rate=speculation.accept_rate,
            speculative=speculation.speculative,
        ))
    return trials


def _failed_apply(report: HostReport, variant: Variant) -> Trial:
    why = report.error or report.status
    if report.status == STATUS_ROLLED_BACK:
        why = f"{why} (rolled back: the host runs its previous configuration)"
    return Trial(host=report.host, variant=variant.label, env=dict(variant.env), flags=dict(variant.flags),
                 status="apply_failed", run_id=report.run_id, error=why, log_tail=report.log_tail)


def role_for(variant: Variant, smoke_check: bool) -> tuple[str, dict[str, object]]:
    """The role that applies ``variant`` and its variables: nccl-env for NCCL variables alone (as
    before launch flags could be swept), launch-flags when it sets or takes out any launch flag."""
    smoke = {"smoke_check": True} if smoke_check else {}
    if not variant.flags and not variant.drop:
        return ROLE, {"nccl_env": dict(variant.env), **smoke}
    return FLAGS_ROLE, {"launch_flags": list(variant.launch), "launch_env": dict(variant.env),
                        "launch_drop": list(variant.drop), **smoke}


def run_sweep(
    hosts: Sequence[Host],
    variants: Sequence[Variant],
    bench_options: BenchOptions,
    store: ResultsStore,
    apply_options: ApplyOptions,
    keep: str = "original",
    say: Callable[[str], None] = lambda line: None,
    levels: BenchOptions | None = None,
) -> SweepOutcome:
    outcome = SweepOutcome(trials={h.name: [] for h in hosts})
    by_name = {h.name: h for h in hosts}
    applied_runs: list[tuple[str, list[str]]] = []  # (run id, hosts it changed), oldest first
    try:
        say(f"tune: measuring the {BASELINE}")
        for trial in _bench(hosts, bench_options, store, apply_options, None, None, levels):
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
            role, variables = role_for(variant, smoke_check=True)
            run_id, reports = apply_role(hosts, role, ExtraVars.checked(role, variables), apply_options)
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
                for trial in _bench(ready, bench_options, store, apply_options, variant, run_id, levels):
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
             outcome: SweepOutcome, say: Callable[[str], None],
             rollback_hosts: Callable[[Sequence[Host], str, ApplyOptions], Mapping[str, HostReport]]) -> None:
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
               outcome: SweepOutcome, say: Callable[[str], None],
               apply_role: Callable[[Sequence[Host], str, ExtraVars, ApplyOptions],
                                    tuple[str, Mapping[str, HostReport]]]) -> None:
    by_label = {v.label: v for v in variants}
    groups: dict[str, list[Host]] = {}
    for host in hosts:
        best = best_variant(outcome.trials[host.name])
        if best is None or best.variant == BASELINE or host.name in outcome.restore_errors:
            continue
        groups.setdefault(best.variant, []).append(host)
    for label, group in groups.items():
        say(f"tune: keeping {label} on {len(group)} host(s)")
        role, variables = role_for(by_label[label], smoke_check=False)
        _, reports = apply_role(group, role, ExtraVars.checked(role, variables), apply_options)
        for name, report in reports.items():
            if report.ok:
                outcome.kept[name] = label
            else:
                outcome.restore_errors[name] = f"applying the best variant failed: {report.error}"
