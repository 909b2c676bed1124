"""What a new SGLang release opens and closes on a host, before anything stops.

Once the release's environment is ready on the host (``apply/release_env.py``), the facts and the
whole-stack gate audit run twice, as ``inspect host`` runs them: on the running tree, and with the
new environment's python (no ``PYTHONPATH``: the environment is the whole stack). The two sets of
verdicts, judged for this host's GPU with the same judge, become the notes of the run: which
features the new release opens, which it closes, and the stack problems the new tree has. On a
docker host the running tree is the container's and the new one the new image's (a throwaway
container of it, no network), as inspect reads a docker server.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING
from gpuops.facts.collect import judge_facts, sglang_probes_in_docker
from gpuops.facts.host import host_facts, preamble, probes_for
from gpuops.facts.software_stack import stack_problems
from gpuops.gates.probe import gate_scan_probe
from gpuops.gather import gather
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpuops.inventory import Host
    from gpuops.plan.release import StandingPatch
    from gpuops.transport import Connection


@frozen
class TreeVerdicts:
    """One SGLang tree's gate audit, as a release switch compares them (``audits``): each feature's status, the
    stack's problems, and why the audit failed, if it did."""

    version: str | None
    features: dict[str, str]      # feature -> open / blocked / unknown ...
    stack: tuple[str, ...]
    error: str | None = None


def _audit(conn: "Connection", host: "Host", python: str | None, image: str | None, offer_kept: bool) -> TreeVerdicts:
    # Through the host's scan cache: the running tree is the one the apply's gather just scanned or
    # found unchanged, so its kept scan answers; the new tree's scan is kept for the next command
    # (the inspect after the switch, a --check, a second host with the same files).
    gate = gate_scan_probe(with_sources=False, host=host, offer=offer_kept)
    script = preamble(host)
    if python is not None:
        # After the usual choice (the running server's interpreter): the new environment's instead.
        script += (f"\nGPUOPS_PY={shlex.quote(python)}; GPUOPS_PY_REASON='the new release environment'; "
                   "export GPUOPS_PY GPUOPS_PY_REASON; unset PYTHONPATH\n")
    probes = sglang_probes_in_docker(host, [*probes_for(host), gate], image)
    values = gather(conn, probes, preamble=script, timeout=600)
    facts = host_facts(values)
    report, error = judge_facts(facts, values.get(gate.name), host.name)
    if report is None:
        return TreeVerdicts(None, {}, (), error or "the gate audit did not run")
    features = {name: str(v.get("status")) for name, v in report.features.items()}
    stack = tuple(stack_problems(facts.packages, facts.banner.cuda_driver_version, ()))
    return TreeVerdicts(report.version, features, stack, error)


def audits(conn: "Connection", host: "Host", new_python: str | None, new_image: str | None = None,
           offer_kept: bool = True) -> tuple[TreeVerdicts, TreeVerdicts]:
    """The running tree's verdicts and the new one's (the new environment's python, or image).
    ``offer_kept=False`` (``--flush-cache``): no kept scan is offered; both trees are scanned."""
    return _audit(conn, host, None, None, offer_kept), _audit(conn, host, new_python, new_image, offer_kept)


def notes(old: TreeVerdicts, new: TreeVerdicts) -> list[str]:
    if new.error and not new.features:
        return [f"gate audit of the new tree: {new.error}"]
    opened = sorted(f for f, s in new.features.items() if s == "open" and old.features.get(f) != "open")
    closed = sorted(f for f, s in old.features.items() if s == "open" and new.features.get(f) != "open")
    out = [f"gate audit, sglang {old.version or '?'} (running) -> {new.version or '?'} (new environment): "
             f"opens {', '.join(opened) or 'nothing'}; closes {', '.join(closed) or 'nothing'} "
             f"({sum(1 for s in new.features.values() if s == 'open')} of {len(new.features)} features open)"]
    out.extend(f"stack of the new environment: {problem}" for problem in new.stack)
    return out


def judge_patches(patches: "Sequence[StandingPatch]", old: TreeVerdicts, new: TreeVerdicts,
                  version: str) -> tuple[list[str], str | None]:
    """A standing source patch of the running release (fusion-sm120's) on the new tree: where the
    new release opens the feature by itself, the switch goes on (a note); otherwise it is refused,
    before anything stops: the patch was planned on the old tree and is never copied over."""
    notes: list[str] = []
    for patch in patches:
        status = new.features.get(patch.feature, "absent")
        if status == "open":
            notes.append(f"{patch.role} (run {patch.run_id}): SGLang {version} opens {patch.feature} on this host by "
                         f"itself, without that run's patch of {old.version or 'the running release'}; its launch "
                         "flag stays")
            continue
        return notes, (f"{patch.role} (run {patch.run_id}) patched SGLang {old.version or 'the running release'} to "
                       f"open {patch.feature}; SGLang {version} as published has it {status} on this host and gpuops "
                       f"never copies a patch to another release: roll that run back first (gpuops rollback --run "
                       f"{patch.run_id}), switch, then apply {patch.role} again to re-plan its patch on the new tree "
                       "-- refused before the server stopped, nothing was changed")
    return notes, None
