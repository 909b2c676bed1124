"""Capability along the whole stack: does the library that runs a feature's kernel admit this GPU?

SGLang's gates are only half of the answer. SGLang 0.5.8 admits sm120 for FlashInfer's all-reduce
fusion once its gate is widened, but the FlashInfer it pins (0.6.1) builds that kernel
(``flashinfer/jit/comm.py::gen_trtllm_comm_module``) for compute-capability majors 9 and 10 only:
the server dies at CUDA-graph capture with "No supported CUDA architectures found for major
versions [9, 10]". So each catalog feature names what it needs of its kernel provider
(``kernels:``, ``catalog.KernelNeed``), the software probe reads exactly that from the host's
installed tree (``facts/software_remote.py``: the generator's ``supported_major_versions``, an
exported name, a module of the release), and this module judges it (pure) and folds it into the
feature's verdict, citing the library's file:line.

Where the host has only a package's metadata and not its files (a broken install, or a lab host
without a real tree), the need is judged by the version rule, the catalog's ``first`` versions
(checked against the real wheels): a version below it is blocked, one at or above it open, both
said to be inferred, never read; unknown only where no rule decides.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Mapping

from gpuops.gates.catalog import Catalog, Feature, KernelNeed
from gpuops.frozen import frozen

# The distribution that carries each provider's version.
# DeepGEMM's package is sgl-deep-gemm (what SGLang pins); its import name, deep_gemm, is what SGLang asks for.
_DISTRIBUTIONS = {"flashinfer": "flashinfer-python", "sglang": "sglang", "sgl_kernel": "sgl-kernel",
                  "deep_gemm": "sgl-deep-gemm"}
_TITLES = {"flashinfer": "FlashInfer", "sglang": "SGLang", "sgl_kernel": "sgl-kernel", "deep_gemm": "DeepGEMM"}


class KernelStatus(enum.Enum):
    OPEN = "open"
    BLOCKED = "blocked"
    UNKNOWN = "unknown"


@frozen
class KernelVerdict:
    """One kernel need of a feature judged for the host's GPU: whether the installed library admits it, why, and
    which file and line of the host says so (or the version alone, when the files were not there)."""

    need: KernelNeed
    status: KernelStatus
    reason: str
    line: int | None = None        # in ``need.where`` on the host
    version: str | None = None     # the provider's installed version
    first: str | None = None       # the first version that has it (for this GPU), from the catalog
    read: bool = True              # False: judged from the version alone (the files were not there)
    file: str | None = None        # the file read, where it is not the need's own (an arch need's .so)

    @property
    def where(self) -> str:
        base = f"{self.need.provider}/{self.file}" if self.file else self.need.where
        return f"{base}:{self.line}" if self.line else base

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.need.provider, "what": self.need.what, "status": self.status.value,
                "reason": self.reason, "file": f"{self.need.provider}/{self.file}" if self.file else self.need.where,
                "line": self.line, "version": self.version, "first": self.first, "read": self.read}


def probe_reads(catalog: Catalog) -> dict[str, dict[str, dict[str, Any]]]:
    """What the software probe reads for the catalog's needs (its argv JSON): per provider and file,
    ``generators`` (every ``def`` with its ``supported_major_versions``), ``symbols`` or nothing (the
    file's presence)."""
    reads: dict[str, dict[str, dict[str, Any]]] = {}
    for feature in catalog.features:
        for fit in feature.fits:
            for file, pattern in fit.at:
                entry = reads.setdefault("sglang", {}).setdefault(file, {})
                key = "dicts" if fit.kind == "capability_major_in" else "anchors"
                item = fit.value if key == "dicts" else pattern
                if item not in entry.setdefault(key, []):
                    entry[key].append(item)
        for need in feature.kernels:
            entry = reads.setdefault(need.provider, {}).setdefault(need.file, {})
            if need.kind == "generator":
                entry["generators"] = True
            elif need.kind == "arch":
                entry["arches"] = True
            elif need.kind == "symbol":
                entry.setdefault("symbols", [])
                if need.name not in entry["symbols"]:
                    entry["symbols"].append(need.name)
    return reads


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:4])


def at_least(version: str | None, first: str | None) -> bool | None:
    if not version or not first:
        return None
    return _version_key(version) >= _version_key(first)


def _major(capability: str | None) -> int | None:
    text = str(capability or "").partition(".")[0]
    return int(text) if text.isdigit() else None


def _sm(capability: str | None) -> str:
    major, _, minor = str(capability or "").partition(".")
    return f"sm{major}{minor or '0'}" if major.isdigit() else "this GPU"


def _first_for(need: KernelNeed, major: int | None) -> str | None:
    if isinstance(need.first, Mapping):
        return need.first.get(major) if major is not None else None
    return need.first


def judge_need(need: KernelNeed, kernels: Mapping[str, Any] | None, versions: Mapping[str, str | None],
               capability: str | None) -> KernelVerdict:
    """One need against what the host's probe read (``kernels``: the probe's ``kernels`` JSON) and
    the installed versions (by provider)."""
    title = _TITLES[need.provider]
    version = versions.get(need.provider)
    named = f"{title} {version}" if version else title
    major = _major(capability)
    first = _first_for(need, major)
    package = (kernels or {}).get(need.provider) if isinstance(kernels, Mapping) else None
    files = package.get("files") if isinstance(package, Mapping) else None
    entry = files.get(need.file) if isinstance(files, Mapping) else None
    if package is not None and not isinstance(entry, Mapping) and (
            not isinstance(package, Mapping) or not isinstance(files, Mapping) or need.file in files):
        # The host sent a read of the package that is not of the probe's shape: neither the files
        # nor the version (host data as well) are taken as a yes.
        return KernelVerdict(need, KernelStatus.UNKNOWN, f"cannot tell: the host's read of {need.where} is malformed",
                             version=version, first=first)
    if not isinstance(entry, Mapping):
        return _from_version(need, named, version, first, capability, kernels is not None)
    if not entry.get("exists"):
        return KernelVerdict(need, KernelStatus.BLOCKED, f"{named} has no {need.where} ({need.what})"
                             + (f"; {title} {first} is the first with it" if first else ""),
                             version=version, first=first)
    if entry.get("error"):
        return KernelVerdict(need, KernelStatus.UNKNOWN, f"cannot tell: {need.where} {entry['error']}", version=version,
                             first=first)
    if need.kind == "module":
        return KernelVerdict(need, KernelStatus.OPEN, f"{named} has {need.where}", version=version, first=first)
    if need.kind == "arch":
        return _judge_arches(need, named, version, _mapping(entry.get("arches")), capability)
    if need.kind == "symbol":
        line = _mapping(entry.get("symbols")).get(str(need.name))
        if isinstance(line, int):
            return KernelVerdict(need, KernelStatus.OPEN, f"{named} has {need.name} ({need.where}:{line})", line,
                                 version, first)
        return KernelVerdict(need, KernelStatus.BLOCKED, f"{named} has no {need.name} in {need.where} ({need.what})"
                             + (f"; {title} {first} is the first with it" if first else ""), version=version,
                             first=first)
    generator = _mapping(entry.get("generators")).get(str(need.name))
    if not isinstance(generator, list) or len(generator) != 3:
        return KernelVerdict(need, KernelStatus.BLOCKED, f"{named} has no {need.name} in {need.where} ({need.what})"
                             + (f"; {title} {first} is the first with it" if first else ""), version=version,
                             first=first)
    def_line, majors, majors_line = generator
    if majors is None:
        return KernelVerdict(need, KernelStatus.OPEN, f"{named} builds {need.what} for every GPU it builds for "
                             f"({need.where}:{def_line}: no architecture list)", def_line, version, first)
    if not isinstance(majors, list):
        return KernelVerdict(need, KernelStatus.UNKNOWN, f"cannot tell which GPUs {named} builds {need.what} for "
                             f"({need.where}:{majors_line}: the list is not a literal)", majors_line, version, first)
    listed = ", ".join(str(m) for m in majors)
    where = f"{need.where}:{majors_line}"
    if major is None:
        return KernelVerdict(need, KernelStatus.UNKNOWN, f"{named} builds {need.what} for majors [{listed}] ({where}); "
                             "the GPU's compute capability is not known", majors_line, version, first)
    if major in majors:
        return KernelVerdict(need, KernelStatus.OPEN, f"{named} builds {need.what} for major {major} "
                             f"({where}: supported_major_versions=[{listed}]); {_build_note(need, kernels, versions, major)}",
                             majors_line, version, first)
    reason = (f"{named} cannot build {need.what} for {_sm(capability)}: {where} builds majors [{listed}] only")
    if first:
        reason += f"; {title} {first} is the first that builds it for major {major}"
    return KernelVerdict(need, KernelStatus.BLOCKED, reason, majors_line, version, first)


def _arch_list(values: Any) -> list[int]:
    return sorted({v for v in values if isinstance(v, int) and not isinstance(v, bool)}) if isinstance(values, list) else []


def runs_on(sass: list[int], ptx: list[int], major: int, minor: int) -> str | None:
    """How device code of these architectures runs on a GPU of ``major.minor``: "sass" (a cubin of
    the same major and a minor not above the GPU's: CUDA's binary compatibility), "ptx" (PTX of an
    architecture not above the GPU's, compiled by the driver at load), else None."""
    gpu = major * 10 + minor
    if any(a // 10 == major and a % 10 <= minor for a in sass):
        return "sass"
    if any(a <= gpu for a in ptx):
        return "ptx"
    return None


def _judge_arches(need: KernelNeed, named: str, version: str | None, files: Mapping[str, Any],
                  capability: str | None) -> KernelVerdict:
    """An extension's compiled architectures (read from each build's ``.nv_fatbin``) against the
    GPU: open when a build of it carries device code that runs there (sgl-kernel loads one of its
    builds by the GPU, so one that runs is enough), blocked when none does."""
    def shown(arches: Mapping[str, Any]) -> str:
        sass = ", ".join(f"sm_{a}" for a in _arch_list(arches.get("sass")))
        ptx = ", ".join(f"compute_{a}" for a in _arch_list(arches.get("ptx")))
        return "; ".join(p for p in (f"SASS {sass}" if sass else "", f"PTX {ptx}" if ptx else "") if p) or "none"

    read = {str(rel): arches for rel, arches in files.items() if isinstance(arches, Mapping) and not arches.get("error")}
    major, _, minor_text = str(capability or "").partition(".")
    if not read:
        errors = "; ".join(f"{rel}: {a.get('error')}" for rel, a in files.items() if isinstance(a, Mapping)) or \
            "no build read"
        return KernelVerdict(need, KernelStatus.UNKNOWN, f"cannot tell which GPUs {named}'s {need.file} extension is "
                             f"built for ({errors})", version=version)
    if not major.isdigit():
        rel = next(iter(sorted(read)))
        return KernelVerdict(need, KernelStatus.UNKNOWN, f"{named} builds {need.what} for {shown(read[rel])} "
                             f"({need.provider}/{rel}); the GPU's compute capability is not known", version=version,
                             file=rel)
    minor = int(minor_text) if minor_text.isdigit() else 0
    for rel in sorted(read):
        how = runs_on(_arch_list(read[rel].get("sass")), _arch_list(read[rel].get("ptx")), int(major), minor)
        if how is not None:
            said = "device code for" if how == "sass" else "PTX the driver compiles at load for"
            return KernelVerdict(need, KernelStatus.OPEN, f"{named}'s {need.provider}/{rel} carries {said} "
                                 f"{_sm(capability)} ({need.what}; its .nv_fatbin: {shown(read[rel])})", version=version,
                                 file=rel)
    builds = "; ".join(f"{need.provider}/{rel}: {shown(read[rel])}" for rel in sorted(read))
    return KernelVerdict(need, KernelStatus.BLOCKED, f"{named} has no device code for {_sm(capability)} in {need.what} "
                         f"(its .nv_fatbin: {builds})", version=version, file=sorted(read)[0])


# The first CUDA release whose nvcc targets each compute-capability major (CUDA 12.8 added the
# Blackwell targets sm_100 and sm_120; 11.8 added sm_90).
_NVCC_FIRST = {9: "11.8", 10: "12.8", 12: "12.8"}


def _build_note(need: KernelNeed, kernels: Mapping[str, Any] | None, versions: Mapping[str, str | None],
                major: int) -> str:
    """How the JIT module would be had on this host: prebuilt (flashinfer-jit-cache, or an AOT
    directory of that name), else compiled by nvcc, which must target the GPU's major. Said, not
    judged: FlashInfer may also find an nvcc through CUDA_HOME or the nvidia-cuda-nvcc package."""
    cache = versions.get("flashinfer_jit_cache")
    if cache:
        return f"prebuilt JIT modules installed (flashinfer-jit-cache {cache})"
    package = (kernels or {}).get(need.provider) if isinstance(kernels, Mapping) else None
    aot = package.get("aot") if isinstance(package, Mapping) else None
    if isinstance(aot, list) and aot:
        return f"{len(aot)} prebuilt module(s) in {need.provider}/data/aot"
    nvcc = (kernels or {}).get("nvcc") if isinstance(kernels, Mapping) else None
    if not isinstance(nvcc, Mapping) or not nvcc.get("path"):
        return ("no prebuilt module found: it is compiled at first use, and no nvcc is on the host's PATH or in "
                "/usr/local/cuda/bin (FlashInfer may find one through CUDA_HOME)")
    found = str(nvcc.get("version") or "")
    wanted = _NVCC_FIRST.get(major)
    if found and wanted and at_least(found, wanted) is False:
        return (f"no prebuilt module found: it is compiled at first use, and {nvcc['path']} is CUDA {found}, which "
                f"cannot target major {major} (CUDA {wanted} is the first that can)")
    return f"compiled at first use with {nvcc['path']} (CUDA {found or 'version unknown'})"


def _mapping(value: Any) -> Mapping[str, Any]:
    """A host's JSON value where a mapping is expected (anything else reads as empty)."""
    return value if isinstance(value, Mapping) else {}


def _from_version(need: KernelNeed, named: str, version: str | None, first: str | None, capability: str | None,
                  probed: bool) -> KernelVerdict:
    """No files read (not installed, metadata only, or an older probe): judged by the version rule,
    the catalog's ``first`` (held to the real wheels by tests/integration/test_kernel_libraries.py),
    marked as inferred (``read`` false). A version below the first with the kernel is a known no;
    one at or above it a yes by the releases; unknown only when neither the files nor the version
    decide (no version, or no rule for this GPU)."""
    title = _TITLES[need.provider]
    if version is None:
        if not probed:
            return KernelVerdict(need, KernelStatus.UNKNOWN, f"{title}'s files were not read on this host", read=False)
        return KernelVerdict(need, KernelStatus.BLOCKED, f"{title} is not installed for this python (it runs {need.what})",
                             first=first, read=False)
    has = at_least(version, first)
    if has is None:
        return KernelVerdict(need, KernelStatus.UNKNOWN, f"{named}'s files are not on this host (metadata only), and no "
                             f"version rule says whether it has {need.what}" + (f" for {_sm(capability)}" if
                                                                                 isinstance(need.first, Mapping) else ""),
                             version=version, first=first, read=False)
    gpu = f" for {_sm(capability)}" if isinstance(need.first, Mapping) else ""
    rule = f"version rule: {title} {first} is the first with it{gpu}, from the real wheels (gates/catalog.yaml)"
    files = "its files are not on this host (metadata only)" if probed else "its files were not read"
    if has:
        return KernelVerdict(need, KernelStatus.OPEN, f"{named} has {need.what}{gpu} by its version ({rule}); {files}",
                             version=version, first=first, read=False)
    return KernelVerdict(need, KernelStatus.BLOCKED, f"{named} lacks {need.what}{gpu} by its version ({rule}); {files}",
                         version=version, first=first, read=False)


def judge_feature(feature: Feature, kernels: Mapping[str, Any] | None, versions: Mapping[str, str | None],
                  capability: str | None) -> list[KernelVerdict]:
    return [judge_need(need, kernels, versions, capability) for need in feature.kernels]


def versions_of(packages: Any) -> dict[str, str | None]:
    """The providers' installed versions from ``facts.software.PythonPackages``."""
    found = getattr(packages, "packages", None) or {}
    out: dict[str, str | None] = {}
    for provider, dist in (*_DISTRIBUTIONS.items(), ("flashinfer_jit_cache", "flashinfer-jit-cache")):
        info = found.get(dist)
        if info is None and provider == "sgl_kernel":
            info = found.get("sglang-kernel")  # sgl-kernel's later name, the same import name
        out[provider] = getattr(info, "version", None) if info is not None else None
    return out


def close(out: dict[str, Any], lead: str, why: str) -> None:
    """Close a gated feature's verdict ``out`` (in place) for what this host lacks: ``lead`` before
    SGLang's own reason, and not in effect whatever the server asks (``why``). A default-on feature
    was never asked for: the judgement's own words say why it was on."""
    sglang = str(out.get("reason") or "")
    if out.get("status") == "open":
        out["status"] = "blocked"
        out["reason"] = f"{lead}; SGLang's own gates admit it ({gates_reason(sglang)})"
    else:
        out["reason"] = f"{sglang}; and {lead}" if sglang else lead
    if out.get("in_effect") is True:
        out["in_effect"] = False
        out["in_effect_reason"] = f"{out.get('in_effect_reason') or 'on'}, but it never runs here: {why}"


def gates_reason(reason: str) -> str:
    """An open verdict's reason without its words on whether the server runs it: once something
    else closes the feature, those are no longer the verdict's (its in_effect says why)."""
    return re.sub(r"; (not )?in effect(: cannot tell)? in the running server: .*$", "", reason)


def fold(verdict: Mapping[str, Any], kernel: list[KernelVerdict], gated: bool = True) -> dict[str, Any]:
    """The feature's verdict with its kernel provider's: open only when SGLang's gates AND the
    library admit the GPU. A closed library closes the feature (reason and file:line first); one
    that cannot be told is said beside an open verdict; each need is listed under ``kernels``.
    ``gated=False``: a feature SGLang does not gate by GPU generation (no gate rules in the
    catalog): its needs decide alone."""
    out = dict(verdict)
    out["kernels"] = [k.to_json() for k in kernel]
    if not kernel:
        return out
    blocked = [k for k in kernel if k.status is KernelStatus.BLOCKED]
    unknown = [k for k in kernel if k.status is KernelStatus.UNKNOWN]
    if not gated:
        out["status"] = "blocked" if blocked else "unknown" if unknown else "open"
        out["reason"] = "; ".join(k.reason for k in (blocked or unknown or kernel))
        return out
    sglang = str(out.get("reason") or "")
    if blocked:
        # What the server's flags ask for cannot run: the library has no kernel for this GPU.
        close(out, "; ".join(k.reason for k in blocked), blocked[0].reason)
    elif unknown:
        out["reason"] = f"{sglang}; kernel library: {'; '.join(k.reason for k in unknown)}" if sglang else \
            "; ".join(k.reason for k in unknown)
    return out
