"""All facts of one host: the probes to gather (built from the Host) and the typed result.

    probes = probes_for(host)                     # + any other probes of the same exec (gate scan)
    values = gather(conn, probes, preamble=preamble(host))
    facts = host_facts(values)                    # pure
    facts_json(facts)                             # the documented schema (docs/inspect-json.md)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuops.facts import gpu as gpu_fact
from gpuops.facts import server as server_fact
from gpuops.facts import software as software_fact
from gpuops.facts import topology as topology_fact
from gpuops.facts.gpu import GpuQuery, SmiBanner
from gpuops.facts.managed import ManagedLaunch, is_managed_launch, managed_launch_probe
from gpuops.facts.python_select import GPUOPS_PYTHON_MISSING, preamble
from gpuops.facts.server import ServerFacts
from gpuops.facts.software import HostSystem, PythonPackages
from gpuops.facts.topology import Interconnect
from gpuops.gather import Probe
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host

__all__ = ["HostFacts", "host_facts", "preamble", "probes_for"]


@frozen
class HostFacts:
    """Every fact of one host, typed (``host_facts``, pure, from one exec's probe values): GPUs, interconnect,
    system, packages and server, and the warnings they add up to."""

    gpu: GpuQuery
    banner: SmiBanner
    interconnect: Interconnect
    system: HostSystem
    packages: PythonPackages
    server: ServerFacts
    warnings: tuple[str, ...]
    # The launch parts of gpuops runs still in effect (facts/managed.py); None when there are none.
    managed: ManagedLaunch | None = None

    @property
    def compute_capability(self) -> str | None:
        """The compute capability gates are judged against: the lowest of the host's GPUs."""
        return gpu_fact.lowest_compute_capability(self.gpu)

    @property
    def torch_cuda(self) -> str | None:
        torch = self.packages.packages.get("torch") if self.packages.known else None
        return torch.cuda if torch else None


def probes_for(host: Host) -> list[Probe[object]]:
    """Every fact probe for this host; run them after ``preamble(host)`` in the same exec."""
    state_dir = (host.vars or {}).get("gpuops_state_dir")
    return [
        *gpu_fact.probes(),  # the nvidia-smi calls of both facts start side by side (Probe.start)
        *topology_fact.probes(),
        *software_fact.probes(),
        *server_fact.probes(str(state_dir) if state_dir else None),
        managed_launch_probe(str(state_dir) if state_dir else None,
                             str((host.vars or {}).get("gpuops_envs_dir") or "") or None),
    ]


def host_facts(values: Mapping[str, object]) -> HostFacts:
    """The typed facts from the parsed probe values (a failed probe becomes an unknown with reason)."""
    gpu, banner = gpu_fact.from_values(values)
    system, packages = software_fact.from_values(values)
    server = server_fact.from_values(values)
    interconnect = topology_fact.from_values(values)
    return HostFacts(
        gpu=gpu,
        banner=banner,
        interconnect=interconnect,
        system=system,
        packages=packages,
        server=server,
        warnings=tuple(_warnings(gpu, interconnect, packages, server, system)),
        managed=managed if is_managed_launch(managed := values.get("gpuops.desired")) else None,
    )


def _warnings(gpu: GpuQuery, interconnect: Interconnect, packages: PythonPackages, server: ServerFacts,
              system: HostSystem | None = None) -> list[str]:
    warnings = list(interconnect.warnings)
    # The gather's preamble names a gpuops_python that is not on the host (python_select.py), even
    # when it probed with another python: apply, rollback and history would fail on it.
    reason = (system.chosen_python_reason if system is not None else None) or ""
    warnings += [part.strip() for part in reason.split("; ") if part.strip().endswith(GPUOPS_PYTHON_MISSING)]
    names = sorted({g.name for g in gpu.gpus})
    if len(names) > 1:
        warnings.append(f"mixed GPU models on one host ({', '.join(names)}): tensor parallelism runs at the slowest GPU's pace")
    sms = sorted({g.sm for g in gpu.gpus if g.sm})
    if len(sms) > 1:
        warnings.append(f"mixed compute capabilities ({', '.join(sms)}): gates are judged for the lowest")
    settings = server.settings
    if settings and gpu.known and settings.tp_size > len(gpu.gpus):
        warnings.append(f"the server asks for --tp {settings.tp_size} but the host has {len(gpu.gpus)} GPUs")
    if settings and interconnect.p2p_all_pairs is False and settings.tp_size > 1 and not settings.disable_custom_all_reduce:
        warnings.append(
            f"the server runs TP {settings.tp_size} without --disable-custom-all-reduce on a host where "
            "not every GPU pair can do peer-to-peer: SGLang's custom all-reduce will be disabled or fail"
        )
    if server.running and server.healthy is False:
        warnings.append(f"the SGLang server (pid {server.pid}) does not answer {server.health_url} with 200")
    return warnings
