"""The pipeline's first step: ONE exec that reads what a host's plan needs (the files the role
touches, the journal, the server's state, the launch pythons' entrypoints, and the gate scan with the
GPU facts when the role patches), turned into ``PlanFacts`` and the host's journal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from gpuops.apply import container_audit, kept_facts
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.probes import (
    entrypoints_probe,
    files_probe,
    journal_probe,
    server_probe,
)
from gpuops.errors import GpuopsError
from gpuops.facts import gpu as gpu_fact
from gpuops.facts import topology as topology_fact
from gpuops.facts.python_select import preamble_for_vars
from gpuops.facts.software import python_packages_probe
from gpuops.frozen import frozen
from gpuops.gates.kernels import versions_of
from gpuops.gates.probe import gate_scan_probe
from gpuops.gather import ProbeFailure, gather, in_background
from gpuops.plan.model import PlanFacts
from gpuops.shipping import missing_python

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.plan.planner import Discovery
    from gpuops.transport import Connection


@frozen
class Gathered:
    """What the gather read beside the plan's facts: the host's journal, its python, its problems."""

    journal: list[dict[str, Any]]
    python: Any
    problems: Any


@frozen
class HostProbes:
    """What the one exec sends, and the kept GPU facts the probes offer (None when the role reads no
    GPU facts, or for a container)."""

    probes: list[Any]
    kept: Any


def gather_host(conn: "Connection", host: "Host", extra: ExtraVars,
                discovery: "Discovery", planned: HostProbes) -> tuple["PlanFacts", Gathered]:
    """The exec of ``planned`` (built while the connection was being made), turned into facts."""

    values = gather(conn, planned.probes, preamble=preamble_for_vars(extra.for_host(host)))
    return _facts(host, discovery, values, planned.kept)


def gather_probes(host: "Host", discovery: "Discovery", offer_kept: bool) -> HostProbes:
    """The probes of the one exec, and the kept GPU facts they offer. ``benchmarks/apply_overhead``'s
    floor sends exactly these."""

    probes: list[Any] = [files_probe(discovery.paths), journal_probe(discovery.state_dir)]
    if discovery.needs_server_state:
        probes.append(server_probe())
    kept = None
    if discovery.needs_gate_scan:
        # with sources: the patch planner's input; kept per host (offered unless --flush-cache)
        probes.append(gate_scan_probe(with_sources=True, host=host, offer=offer_kept))
        gpu_probes = gpu_probes_for(host)  # applicability (GPU generation, P2P) is planned from these
        if discovery.container is None:  # docker: the stack is read inside the container, never kept
            kept = kept_facts.guard(host, gpu_probes, offer=offer_kept)  # skipped on the host while its fingerprint holds
            gpu_probes = kept.probes
        probes.extend(gpu_probes)
    if discovery.entrypoint_pythons:
        # Its pythons start with the exec and run beside the probes above (the scan's check is the
        # longest): on a lab host a no-op's exec took 73 ms less without it, of ~0.16 s of probes.
        probes.append(in_background(entrypoints_probe(discovery.entrypoint_pythons, discovery.desired_path)))
    return HostProbes(container_audit.gather_probes(discovery, probes), kept)  # docker: the SGLang in the container


def _facts(host: "Host", discovery: "Discovery", values: Mapping[str, Any], kept: Any) -> tuple["PlanFacts", Gathered]:
    files = values["apply.files"]
    if isinstance(files, ProbeFailure):
        no_python = missing_python(files.reason)
        if no_python is not None:
            raise GpuopsError(f"{host.name}: {no_python} (nothing was changed)")
        raise GpuopsError(f"{host.name}: cannot read the files the role manages: {files.reason}")
    journal = values["apply.journal"]
    journal = [] if isinstance(journal, ProbeFailure) else journal
    scan = gpu = None
    if discovery.needs_gate_scan:
        scan = values.get("gates.scan")
        if isinstance(scan, ProbeFailure):
            raise GpuopsError(f"{host.name}: the gate scan failed: {scan.reason}")
        gpu = _gpu(host, values, kept)
    running = values.get("apply.server")
    if isinstance(running, ProbeFailure):
        raise GpuopsError(f"{host.name}: cannot tell whether the server runs: {running.reason}")
    entrypoints = values.get("apply.entrypoints")
    if isinstance(entrypoints, ProbeFailure):  # unread: each launch keeps -m sglang.launch_server
        entrypoints = {}
    facts = PlanFacts(host=host.name, files=files["files"], gate_scan=scan, gpu=gpu,
                      container=container_audit.container_facts(values), server_running=running,
                      entrypoints=entrypoints)
    return facts, Gathered(journal=journal, python=files["python"], problems=files["problems"])


def _gpu(host: "Host", values: Mapping[str, Any], kept: Any) -> dict[str, Any]:
    if kept is None:
        return gpu_summary(values)

    return kept_facts.summary(kept, host.name, values, gpu_summary)


def gpu_probes_for(host: "Host") -> list[Any]:
    """The facts part's GPU probes (and the package list, for torch's CUDA): the very probes
    ``facts.host.probes_for`` gathers under these names (tests/unit/test_gpu_probes_for_apply.py),
    built from their own modules so a no-op whose GPU facts are kept never imports the rest of the
    facts (server, launch, the host report: ~3 ms). Gathered with the gate scan only (a role that
    patches): a no-op nccl-env run does not pay for nvidia-smi and the package list."""
    del host  # the GPU probes are the same for every host (probes_for's host-specific ones are not GPU probes)
    try:
        return [*gpu_fact.probes(), *topology_fact.probes(), python_packages_probe()]
    except Exception:  # facts help judge the re-audit; without them it is judged for the target
        return []


def gpu_summary(values: Mapping[str, Any]) -> dict[str, Any]:
    """Compute capability and CUDA version from the facts probes (None where unknown)."""
    from gpuops.facts.host import host_facts

    try:
        facts = host_facts(values)
    except Exception:  # facts are a help for judging, never a reason to fail the apply
        return {}
    interconnect = facts.interconnect
    return {"compute_capability": facts.compute_capability,
            "cuda": facts.torch_cuda or facts.banner.cuda_driver_version,
            "gpu_count": len(facts.gpu.gpus) if facts.gpu.known else None,
            "nvlink": interconnect.nvlink,
            "p2p_all_pairs": interconnect.p2p_all_pairs if interconnect.p2p_known else None,
            "p2p_failed_pairs": [list(p) for p in interconnect.p2p_failed_pairs],
            # What the kernel libraries' files say and their versions (gates/kernels.py): a patch
            # whose kernel the host's FlashInfer cannot build is refused (plan/modules.py).
            "kernel_reads": facts.packages.kernels if facts.packages.known else None,
            "kernel_versions": versions_of(facts.packages)}
