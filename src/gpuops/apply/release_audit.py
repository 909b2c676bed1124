"""What a new SGLang release opens and closes on a host, before anything stops.

Once the release's environment is ready on the host (``apply/release_env.py``), the facts and the
whole-stack gate audit run twice, as ``inspect host`` runs them: on the running tree, and with the
new environment's python (no ``PYTHONPATH``: the environment is the whole stack). The two sets of
verdicts, judged for this host's GPU with the same judge, become the notes of the run: which
features the new release opens, which it closes, and the stack problems the new tree has.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport import Connection


@dataclass(frozen=True)
class TreeVerdicts:
    version: str | None
    features: dict[str, str]      # feature -> open / blocked / unknown ...
    stack: tuple[str, ...]
    error: str | None = None


def _audit(conn: "Connection", host: "Host", python: str | None) -> TreeVerdicts:
    from gpuops.facts.collect import judge_facts
    from gpuops.facts.host import host_facts, preamble, probes_for
    from gpuops.facts.software_stack import stack_problems
    from gpuops.gates.probe import gate_scan_probe
    from gpuops.gather import gather

    gate = gate_scan_probe(with_sources=False)  # nothing kept is offered: a new tree is scanned
    script = preamble(host)
    if python is not None:
        # After the usual choice (the running server's interpreter): the new environment's instead.
        script += (f"\nGPUOPS_PY={shlex.quote(python)}; GPUOPS_PY_REASON='the new release environment'; "
                   "export GPUOPS_PY GPUOPS_PY_REASON; unset PYTHONPATH\n")
    values = gather(conn, [*probes_for(host), gate], preamble=script, timeout=600)
    facts = host_facts(values)
    report, error = judge_facts(facts, values.get(gate.name), host.name)
    if report is None:
        return TreeVerdicts(None, {}, (), error or "the gate audit did not run")
    features = {name: str(v.get("status")) for name, v in report.features.items()}
    stack = tuple(stack_problems(facts.packages, facts.banner.cuda_driver_version, ()))
    return TreeVerdicts(report.version, features, stack, error)


def compare(conn: "Connection", host: "Host", new_python: str) -> list[str]:
    """Notes: what the new tree opens and closes against the running one, and its stack problems."""
    old = _audit(conn, host, None)
    new = _audit(conn, host, new_python)
    if new.error and not new.features:
        return [f"gate audit of the new tree: {new.error}"]
    opened = sorted(f for f, s in new.features.items() if s == "open" and old.features.get(f) != "open")
    closed = sorted(f for f, s in old.features.items() if s == "open" and new.features.get(f) != "open")
    notes = [f"gate audit, sglang {old.version or '?'} (running) -> {new.version or '?'} (new environment): "
             f"opens {', '.join(opened) or 'nothing'}; closes {', '.join(closed) or 'nothing'} "
             f"({sum(1 for s in new.features.values() if s == 'open')} of {len(new.features)} features open)"]
    notes.extend(f"stack of the new environment: {problem}" for problem in new.stack)
    return notes
