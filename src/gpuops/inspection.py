"""``gpuops inspect`` across hosts: ONE exec per host, hosts in parallel; one host failing never
stops the others.

Connect, run one gather script holding every fact probe, the gate scanner and the apply journal,
then parse and judge locally (``facts/collect.py``). A run whose host-side worker died is rolled
back first and the host gathered again (``apply/recovery.py``): so this sits above apply, with the
other things a command does across hosts, while the facts themselves stay below it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpuops import timings, transport
from gpuops.apply.recovery import has_unfinished, journal_probe_for, recover_host
from gpuops.facts.collect import (HostInspection, gate_scan_probe_for, judge_facts, scan_summary, sglang_probes_in_docker,
                                  stack_problems_of)
from gpuops.facts.host import host_facts, preamble, probes_for
from gpuops.frozen import frozen
from gpuops.gates.catalog import load_catalog
from gpuops.gather import Probe, gather
from gpuops.prefetch import prefetch
from gpuops.transport import run_on_hosts

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport import ConnectOptions, HostOutcome

DEFAULT_TIMEOUT_S = 120.0


@frozen
class InspectProbes:
    """What one host's exec runs: the fact probes (with the gate scan, when there is one), the apply
    journal's, and why the gate scan is missing (``gates_error``)."""

    facts: list[Probe[object]]
    gate: Probe[object] | None
    gates_error: str | None
    journal: Probe[object]

    @property
    def all(self) -> list[Probe[object]]:
        return self.facts + [self.journal]


def inspect_probes(host: Host, with_gates: bool = True, with_sources: bool = False, recall: bool = True,
                   extra_probes: Sequence[Probe[object]] = ()) -> InspectProbes:
    """The probes of `gpuops inspect`'s one exec for ``host`` (``benchmarks/inspect_overhead``'s floor
    sends exactly these)."""
    probes: list[Probe[object]] = probes_for(host) + list(extra_probes)
    gate_probe, gates_error = gate_scan_probe_for(with_sources, host, offer=recall) if with_gates else (None, None)
    if gate_probe is not None:
        probes.append(gate_probe)
    # a run whose worker died is rolled back before facts are told: the journal says so
    return InspectProbes(facts=sglang_probes_in_docker(host, probes), gate=gate_probe, gates_error=gates_error,
                         journal=journal_probe_for(host))


def inspect_host(host: Host, options: ConnectOptions, with_gates: bool = True, with_sources: bool = False,
                 timeout: float | None = DEFAULT_TIMEOUT_S, extra_probes: Sequence[Probe[object]] = (),
                 recall: bool = True, while_waiting: tuple[Callable[[], object], ...] = ()) -> HostInspection:
    """Everything `gpuops inspect` knows about one host, from ONE remote exec. ``recall=False``
    (``--flush-cache``): no kept scan is offered and no kept verdict recalled. ``while_waiting``: the
    caller's own work to do during the exec, beside the catalog's (``gpuops.prefetch``: a command
    module's import of the library it renders with)."""
    planned = inspect_probes(host, with_gates, with_sources, recall, extra_probes)
    gate_probe, gates_error, journal = planned.gate, planned.gates_error, planned.journal
    script_preamble = preamble(host)
    recovered: list[str] = []
    later = None
    try:
        conn = transport.connect(host, options)
        try:
            # While this thread waits on the exec, another reads the gate catalog judging needs (not
            # earlier: key exchange and authentication are CPU work here, they would only slow down).
            later = prefetch(*((load_catalog,) if gate_probe is not None else ()), *while_waiting)
            values = gather(conn, planned.all, preamble=script_preamble, timeout=timeout)
            if has_unfinished(values.get(journal.name)):
                recovered = recover_host(conn, host)
                values = gather(conn, planned.all, preamble=script_preamble, timeout=timeout)
        finally:
            conn.close()
    finally:
        if later is not None:
            later.join()  # the work is done once: never by this thread while the prefetch is at it

    with timings.span("parse", host.name):
        facts = host_facts(values)
        report = None
        if gate_probe is not None:
            report, gates_error = judge_facts(facts, values.get(gate_probe.name), host.name, recall=recall)
    extra = {p.name: values.get(p.name) for p in extra_probes}
    return HostInspection(facts=facts, gate_report=report, gates_error=gates_error, extra=extra,
                          gate_scan=scan_summary(values.get(gate_probe.name)) if gate_probe is not None else None,
                          recovered=tuple(recovered), journal=values.get(journal.name),
                          stack=tuple(stack_problems_of(facts, report)))


def inspect_hosts(hosts: Sequence[Host], options: ConnectOptions, forks: int = 16, with_gates: bool = True,
                  with_sources: bool = False, timeout: float | None = DEFAULT_TIMEOUT_S,
                  recall: bool = True, while_waiting: tuple[Callable[[], object], ...] = ()
                  ) -> dict[str, HostOutcome[HostInspection]]:
    return run_on_hosts(
        hosts,
        lambda host: inspect_host(host, options, with_gates=with_gates, with_sources=with_sources, timeout=timeout,
                                  recall=recall, while_waiting=while_waiting),
        forks=forks,
    )
