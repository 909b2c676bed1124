"""What `gpuops inspect` makes of one host's gathered values: the facts, the gate scan judged
locally, the SGLang stack's problems, and the JSON of each host's outcome. The exec itself (one
per host, hosts in parallel, a dead run finished first) is ``gpuops/inspection.py``'s, above apply.
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, TypedDict

from gpuops.facts.host import HostFacts
from gpuops.facts.to_json import FactsJSON, facts_json
from gpuops.facts.container_python import docker_target, in_container, in_image_probe
from gpuops.facts.managed import ManagedLaunch
from gpuops.facts.server_report import report_json
from gpuops.facts.software_stack import flashinfer_wanted, stack_problems
from gpuops.gates import fits, kernels
from gpuops.gates.fits import HostShape, deterministic_collectives, p2p_gaps, tp_group, weight_format
from gpuops.gates.judge_memo import judge_or_recall
from gpuops.gates.scan import GateScan
from gpuops.gather import Probe, ProbeFailure
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.gates.evaluate import GateReport
    from gpuops.gates.scan import GateScan
    from gpuops.gather import ProbeFailure
    from gpuops.inventory import Host
    from gpuops.transport import HostOutcome



class ScanSummary(TypedDict):
    """``gate_scan`` of a host's inspect entry: the kept scan used, and the scanned tree's fingerprint."""

    cached: bool
    fingerprint: str | None


@frozen
class HostInspection:
    """What ``gpuops inspect`` made of one host's gathered values: its facts, the gate scan judged against them,
    the SGLang stack's inconsistencies, and the journal as read."""

    facts: HostFacts
    gate_report: GateReport | None = None  # when the gate scan ran and was judged
    gates_error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)  # values of any extra probes, by name
    stack: tuple[str, ...] = ()  # inconsistencies of the SGLang stack (facts/software_stack.py)
    gate_scan: ScanSummary | None = None  # the gate scan itself, when it was asked for
    recovered: tuple[str, ...] = ()  # notes of unfinished runs rolled back before the facts were read
    # The apply journal as read (after any recovery): its records, else why not (a ProbeFailure); a
    # deployment split by its last run is told from it (facts/deployment.py).
    journal: object = None


class HostJSON(TypedDict):
    """One host's entry of the ``inspect host --json`` document (``host_json``)."""

    ok: bool
    error: str | None
    facts: FactsJSON | None
    managed_launch: ManagedLaunch | None
    stack_problems: list[str]
    gates: list[dict[str, object]]
    features: dict[str, dict[str, object]]
    gate_counts: dict[str, int] | None
    gates_error: str | None
    recovered: list[str]
    gate_scan: ScanSummary | None


def gate_scan_probe_for(with_sources: bool, host: Host, offer: bool = True) -> tuple[Probe[GateScan] | None, str | None]:
    try:
        from gpuops.gates.probe import gate_scan_probe
    except ImportError as exc:
        return None, f"the gate scanner is not available in this gpuops ({exc})"
    return gate_scan_probe(with_sources=with_sources, host=host, offer=offer), None  # offers the scans kept for this host


def scan_summary(scan: object) -> ScanSummary:
    """What `inspect --json` says of the gate scan itself: whether the host scanned or the kept scan
    of its unchanged tree was used, and that tree's fingerprint (none when the scan never came back)."""

    if not isinstance(scan, GateScan):
        return {"cached": False, "fingerprint": None}
    return {"cached": scan.cached, "fingerprint": scan.fingerprint}


_READS_SGLANG = ("host.system", "software.python", "gates.scan")


def sglang_probes_in_docker(host: Host, probes: list[Probe[object]], image: str | None = None) -> list[Probe[object]]:
    """On a docker-managed host, the probes that read SGLang (its packages, the gate scan) run with
    the container's python: the SGLang that matters is the one in the container. The system probe
    gets the same ``$GPUOPS_PY`` so that it reports which python that was, and why. ``image``:
    with that image's python instead (sglang-release's audit of a new image, before it runs)."""

    target = docker_target(host.vars or {})
    if target is None:
        return probes
    if image is not None:
        return [in_image_probe(p, image, target.python) if p.name in _READS_SGLANG else p for p in probes]
    return [in_container(p, target) if p.name in _READS_SGLANG else p for p in probes]


def _judge(facts: HostFacts, scan: object, host_name: str = "", recall: bool = True) -> tuple[GateReport | None, str | None]:
    try:
        from gpuops.gates.evaluate import judge
        from gpuops.gates.scan import GateScan
    except ImportError as exc:
        return None, f"gate evaluation is not available in this gpuops ({exc})"
    if not isinstance(scan, GateScan):
        # The scan's output never came back (ProbeFailure): judge it as an unknown scan, so every
        # catalogued feature still appears, as "unknown" with the reason.

        reason = scan.reason if isinstance(scan, ProbeFailure) else None
        scan = GateScan(known=False, reason=reason or "the gate scan did not run")
    part = facts_json(facts)["server"]
    server: dict[str, object] = dict(part)
    reported = part["reported"]
    if reported:
        # what in_effect believes first; the live parts (requests in flight) would make every verdict new
        server["reported"] = {k: reported.get(k) for k in ("route", "settings", "error")}
    model = facts.server.model
    server["architecture"] = model.architecture if model is not None and model.known else None
    server["gpu_name"] = facts.gpu.gpus[0].name if facts.gpu.known and facts.gpu.gpus else None
    cuda = facts.torch_cuda or facts.banner.cuda_driver_version
    interconnect = {"nvlink": facts.interconnect.nvlink}

    report = judge_or_recall(scan, facts.compute_capability, cuda, server, interconnect,
                             lambda: judge(scan, facts.compute_capability, cuda, server, interconnect=interconnect),
                             host=host_name, recall=recall)
    report = with_kernels(report, facts)
    return report, None if report.known else report.reason


def judge_facts(facts: HostFacts, scan: object, host_name: str = "", recall: bool = True) -> tuple[GateReport | None, str | None]:
    """The verdicts inspect gives for ``scan`` on the host of ``facts`` (SGLang's gates AND the
    kernel libraries'); (None, why) when they cannot be given. sglang-release judges a new tree so.
    ``recall=False`` (``--flush-cache``): no kept verdict is recalled."""
    return _judge(facts, scan, host_name, recall=recall)


def with_kernels(report: GateReport, facts: HostFacts) -> GateReport:
    """The verdicts with what each feature's kernel library admits (gates/kernels.py) and what the
    host must be like (gates/fits.py): open only when SGLang's gates AND the library that runs the
    kernel admit the GPU; a feature without GPU-generation gates is decided by those alone."""
    from gpuops.gates.catalog import load_catalog

    versions = kernels.versions_of(facts.packages)
    reads = facts.packages.kernels if facts.packages.known else None
    return fits.fold_stack(report, load_catalog(), reads, versions, host_shape(facts))


def host_shape(facts: HostFacts) -> HostShape:
    """What the catalog's ``fits:`` are judged against, from the host's facts."""

    settings = facts.server.settings if facts.server.known and facts.server.running else None
    model = facts.server.model
    dtype = None
    deterministic = None
    group: list[int] | None = None
    if settings is not None:
        given = settings.args.get("dtype")
        dtype = str(given) if isinstance(given, str) and given != "auto" else None
        deterministic = deterministic_collectives(settings.args, facts.server.env or {})
        group = tp_group((facts.server.env or {}).get("CUDA_VISIBLE_DEVICES"), len(facts.gpu.gpus), settings.tp_size)
    if dtype is None and model is not None and model.known:
        dtype = model.torch_dtype
    quantization = settings.quantization if settings is not None else None
    if model is not None and model.known:
        weights = weight_format(True, model.quant_method, model.weight_block_size, quantization)
    else:
        weights = weight_format(False, None, None, quantization)
    ic = facts.interconnect
    gaps = None
    if group is not None and ic.p2p_known:
        gaps = p2p_gaps([list(p) for p in ic.p2p_failed_pairs], group)
    return HostShape(tp_size=settings.tp_size if settings else None, dtype=dtype, deterministic=deterministic,
                     nvlink=ic.nvlink, p2p_gaps=gaps, capability=facts.compute_capability,
                     server_args=settings.args if settings else None,
                     server_env=facts.server.env if settings else None,
                     server_report=_reported_settings(facts) if settings else None, weights=weights)


def _reported_settings(facts: HostFacts) -> dict[str, object] | None:
    """The server's own report, as the gated features' in_effect reads it (route, settings, error)."""

    report = report_json(facts.server.reported)
    return {k: report.get(k) for k in ("route", "settings", "error")} if report else None


def stack_problems_of(facts: HostFacts, report: GateReport | None) -> list[str]:
    settings = facts.server.settings if facts.server.known else None
    features = dict(report.features) if report is not None else {}
    wanted = flashinfer_wanted(features, settings.args if settings else None)
    return stack_problems(facts.packages, facts.banner.cuda_driver_version, wanted)


def gate_json(inspection: HostInspection) -> tuple[list[dict[str, object]], dict[str, dict[str, object]]]:
    report = inspection.gate_report
    if report is None:
        return [], {}
    return list(report.gates), dict(report.features)


def gate_counts_json(inspection: HostInspection) -> dict[str, int] | None:
    """The gates by what they cost the GPU (``GateReport.counts``), null without a gate report."""
    report = inspection.gate_report
    return report.counts().to_json() if report is not None and report.known else None


def host_json(outcome: HostOutcome[HostInspection]) -> HostJSON:
    """One host's entry of the `inspect host --json` document."""
    if not outcome.ok or outcome.value is None:
        return {"ok": False, "error": outcome.error or "unknown error", "facts": None, "managed_launch": None,
                "stack_problems": [], "gates": [], "features": {}, "gate_counts": None, "gates_error": None,
                "recovered": [], "gate_scan": None}
    gates, features = gate_json(outcome.value)
    return {
        "ok": True,
        "error": None,
        "facts": facts_json(outcome.value.facts),
        "managed_launch": outcome.value.facts.managed,
        "stack_problems": list(outcome.value.stack),
        "gates": gates,
        "features": features,
        "gate_counts": gate_counts_json(outcome.value),
        "gates_error": outcome.value.gates_error,
        "recovered": list(outcome.value.recovered),
        "gate_scan": outcome.value.gate_scan,
    }
