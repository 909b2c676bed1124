"""Values that planning produces: what the host looks like (``FileState``, ``PlanFacts``) and the
``Plan``. What a plan holds (``Change``, ``ServiceSpec``, ``HandlerRun``, ``CompileCheck``,
``AuditCheck``) lives in ``plan/changes.py`` and is importable from here too: a no-op apply (facts
gathered, an empty plan recalled) does not build those classes (~2 ms of frozen dataclasses)."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Mapping
from gpuops.frozen import frozen

if TYPE_CHECKING:  # the gates part's value; planning never imports the scanner's parser itself
    from gpuops.facts.container_python import ContainerFacts
    from gpuops.gates.scan import GateScan
    from gpuops.plan.entrypoint import LaunchEntry
    from gpuops.plan.changes import (AuditCheck, Change, CompileCheck, HandlerRun, ImageBuild, LogCheck, ReleaseEnv,
                                     ReleaseImage, ServiceSpec)

# The GPU summary a patching role plans from (apply.host_gather.gpu_summary, kept between runs by
# apply/kept_facts.py): compute_capability, cuda, gpu_count, nvlink, p2p_all_pairs, p2p_failed_pairs
# [[GPUa, GPUb, status]], kernel_reads (the software probe's `kernels`), kernel_versions {provider:
# version}. Read back from what was kept, so each value is narrowed where a planner reads it.
GpuSummary = Mapping[str, object]


def summary_text(gpu: GpuSummary | None, key: str) -> str | None:
    """A text value of the GPU summary (compute_capability, cuda); None when absent or not text."""
    value = (gpu or {}).get(key)
    return value if isinstance(value, str) else None


def summary_count(gpu: GpuSummary | None, key: str) -> int | None:
    value = (gpu or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def summary_flag(gpu: GpuSummary | None, key: str) -> bool | None:
    """nvlink, p2p_all_pairs: True, False or not known (None)."""
    value = (gpu or {}).get(key)
    return value if isinstance(value, bool) else None


def summary_pairs(gpu: GpuSummary | None) -> list[list[str]]:
    """p2p_failed_pairs: [[GPUa, GPUb, status], ...]; [] when absent or not a list of lists."""
    value = (gpu or {}).get("p2p_failed_pairs")
    listed = value if isinstance(value, list) else []
    return [[str(part) for part in pair] for pair in listed if isinstance(pair, (list, tuple))]


def summary_mapping(gpu: GpuSummary | None, key: str) -> dict[str, object] | None:
    """kernel_reads, kernel_versions: a JSON object, None when absent or not one."""
    value = (gpu or {}).get(key)
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else None

_IN_CHANGES = ("Change", "ServiceSpec", "HandlerRun", "CompileCheck", "AuditCheck", "LogCheck", "sha256_text")


def __getattr__(name: str) -> object:
    """``from gpuops.plan.model import Change`` (and the rest of plan/changes.py), on first use."""
    if name in _IN_CHANGES:
        from gpuops.plan import changes

        return getattr(changes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@frozen
class FileState:
    """A file as the gather saw it. ``content`` is None when absent or not UTF-8 text; then
    ``problem`` says why it cannot be managed ("is a symbolic link to X", "is not UTF-8 text")."""

    path: str
    exists: bool
    sha256: str | None = None
    mode: str | None = None        # "0644"
    uid: int | None = None
    gid: int | None = None
    content: str | None = None
    problem: str | None = None


@frozen
class PlanFacts:
    """Everything a plan reads about one host (the files its role manages; the gate scan and GPU
    summary when a role needs them); gathered in one exec, then planning is pure. Not the facts
    ``inspect`` reports (``gpuops.facts.host.HostFacts``)."""

    host: str
    files: Mapping[str, FileState] = field(default_factory=dict)
    gate_scan: GateScan | None = None      # the gate scan (when a role needs it), with the sources the patch planner reads
    gpu: GpuSummary | None = None  # gathered with the gate scan; None when not gathered
    # sglang_manager: docker: what the container runs (facts.container_python.parse_container);
    # None when not gathered or no such container.
    container: ContainerFacts | None = None
    # Does an SGLang server run on the host's port (the gather preamble's find, ``apply.probes.server_probe``)?
    # None when not gathered (no task of the role asked: the ``server`` module's discovery does).
    server_running: bool | None = None
    # The entrypoint each launch python's release recommends (plan/entrypoint.py), by python; None
    # when not gathered (no `entrypoint` task in the role).
    entrypoints: Mapping[str, LaunchEntry] | None = None


@frozen
class Plan:
    """What applying a role would do on one host, planned (pure) from its ``PlanFacts``: the file changes, the
    handlers and service to restart, the checks of the result (compile, gate re-audit, server log), the release
    it switches to, and its warnings and notes."""

    host: str
    role: str
    changes: tuple[Change, ...]
    handlers: tuple[HandlerRun, ...]
    service: ServiceSpec | None
    compile_checks: tuple[CompileCheck, ...] = ()
    audit: AuditCheck | None = None
    log_check: LogCheck | None = None   # read the server's log after the restart (pcie-allreduce)
    image: ImageBuild | None = None  # docker: the patch as a derived image (plan/image_patch.py)
    # sglang-release: the environment (or docker image) the host holds before the transaction
    release: ReleaseEnv | ReleaseImage | None = None
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    tasks_ok: int = 0         # tasks evaluated (not skipped by `when`), Ansible's "ok"
    state_dir: str = "/var/lib/gpuops"
    # Launch pythons whose release the gather did not read (a release environment this run builds):
    # launched with -m sglang.launch_server in this plan; apply reads them once built and plans again.
    entrypoints_unread: tuple[str, ...] = ()
    starts: bool = False      # the server is not running and a `server: state: started` task notified its handler to start it

    @property
    def changed(self) -> int:
        return len(self.changes)
