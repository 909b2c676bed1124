"""Software facts: OS, kernel, pythons, and the SGLang stack's versions (sglang, flashinfer,
sgl-kernel, torch + its CUDA, NCCL) as the chosen python ($GPUOPS_PY) sees them: the probes
(``host.system``, ``software.python``), their parsers, the ``software`` JSON key and report lines."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import TypedDict

from gpuops.gather import Probe, ProbeOutput, value_or_unknown
from gpuops.gates.probe import kernel_reads
from gpuops.frozen import frozen

NO_PYTHON_STATUS = 127


@frozen
class HostSystem:
    """What the host is, from sh alone (works with no python at all)."""

    os: str | None
    kernel: str | None
    machine: str | None
    python3: str | None  # the host's `python3` on PATH
    python3_version: str | None
    chosen_python: str | None  # $GPUOPS_PY
    chosen_python_reason: str | None  # $GPUOPS_PY_REASON


@frozen
class PackageInfo:
    """One package of the SGLang stack as the chosen python sees it: its version, where it is installed, and
    what the version was read from."""

    version: str | None
    path: str | None  # the package directory (as `import` would find it)
    source: str | None  # "metadata" | "version.py" | "nvidia-nccl-cu12" | "header" | "library"
    cuda: str | None = None  # torch only: torch.version.cuda
    version_full: str | None = None  # torch only: torch.__version__ ("2.11.0+cu130"), from version.py
    requires: tuple[str, ...] | None = None  # sglang only: its Requires-Dist lines for the stack packages


@frozen
class PythonPackages:
    """What the chosen python ($GPUOPS_PY) has of the SGLang stack (the ``software.python`` probe): its packages
    by distribution name, NCCL, and what the kernel libraries' files say; ``known`` False, with ``reason``, when
    the probe failed."""

    known: bool
    reason: str | None = None
    python_executable: str | None = None
    python_version: str | None = None
    packages: dict[str, PackageInfo | None] = field(default_factory=dict)  # by distribution name
    nccl: PackageInfo | None = None
    search_path: tuple[str, ...] = ()  # the python's sys.path (apply/kept_facts.py fingerprints it)
    # What the kernel libraries' own files say (gates/kernels.py judges it): the probe's `kernels`
    # JSON as the host sent it (untrusted data: every reader checks types); None when not read.
    kernels: Mapping[str, object] | None = None


def kv_lines(text: str) -> dict[str, str]:
    """``KEY=value`` lines (the probes' output format) as a dict; the first of a repeated key wins."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key not in values:
            values[key] = value
    return values


def _unquote(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return value or None


HOST_SYSTEM_SCRIPT = r"""
echo "kernel=$(uname -r 2>/dev/null)"
echo "machine=$(uname -m 2>/dev/null)"
if [ -r /etc/os-release ]; then
  sed -n 's/^PRETTY_NAME=/os=/p' /etc/os-release | head -n 1
fi
if gpuops_p3=$(command -v python3 2>/dev/null); then
  echo "python3=$gpuops_p3"
  "$gpuops_p3" -c 'import sys; print("python3_version=%d.%d.%d" % tuple(sys.version_info[:3]))' 2>/dev/null
fi
echo "chosen_python=${GPUOPS_PY:-}"
echo "chosen_python_reason=${GPUOPS_PY_REASON:-}"
"""


def parse_host_system(out: ProbeOutput) -> HostSystem:
    v = kv_lines(out.stdout)
    return HostSystem(
        os=_unquote(v.get("os")),
        kernel=v.get("kernel") or None,
        machine=v.get("machine") or None,
        python3=v.get("python3") or None,
        python3_version=v.get("python3_version") or None,
        chosen_python=v.get("chosen_python") or None,
        chosen_python_reason=v.get("chosen_python_reason") or None,
    )


def _text(value: object) -> str | None:
    """A text field of the host's JSON: anything else (null, a number) is not known."""
    return value if isinstance(value, str) else None


def _package(raw: object) -> PackageInfo | None:
    if not isinstance(raw, dict):
        return None
    requires = raw.get("requires")
    return PackageInfo(
        version=_text(raw.get("version")),
        path=_text(raw.get("path") or raw.get("location")),
        source=_text(raw.get("source")),
        cuda=_text(raw.get("cuda")),
        version_full=_text(raw.get("version_full")),
        requires=tuple(str(r) for r in requires) if isinstance(requires, list) else None,
    )


def parse_python_packages(out: ProbeOutput) -> PythonPackages:
    if out.exit_status == NO_PYTHON_STATUS and not out.stdout.strip():
        detail = out.stderr.strip().splitlines()[-1:] or ["no python"]
        return PythonPackages(known=False, reason=detail[0].removeprefix("gpuops: "))
    if out.exit_status != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.exit_status}"])[-1]
        return PythonPackages(known=False, reason=f"the package probe failed (exit status {out.exit_status}): {last[:200]}")
    try:
        data: object = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return PythonPackages(known=False, reason="the package probe printed no JSON")
    if not isinstance(data, dict):
        return PythonPackages(known=False, reason="the package probe printed no JSON object")
    python = data.get("python") or {}
    python = python if isinstance(python, dict) else {}
    listed = data.get("packages") or {}
    packages = {str(name): _package(raw) for name, raw in (listed.items() if isinstance(listed, dict) else ())}
    kernels = data.get("kernels")
    path = python.get("path") or ()
    return PythonPackages(
        known=True,
        python_executable=_text(python.get("executable")),
        python_version=_text(python.get("version")),
        packages=packages,
        nccl=_package(data.get("nccl")),
        search_path=tuple(p for p in (path if isinstance(path, (list, tuple)) else ()) if isinstance(p, str) and p),
        kernels=kernels if isinstance(kernels, dict) else None,
    )


def remote_source() -> str:
    return Path(__file__).with_name("software_remote.py").read_text(encoding="utf-8")  # importlib.resources costs ~2 ms to import


def host_system_probe() -> Probe[HostSystem]:
    return Probe("host.system", HOST_SYSTEM_SCRIPT.strip(), parse_host_system)


def python_packages_probe() -> Probe[PythonPackages]:
    # What to read of the kernel libraries' files: the catalog's `kernels:` needs (gates/kernels.py).
    reads = json.dumps(kernel_reads(), sort_keys=True)
    script = (
        '[ -n "${GPUOPS_PY:-}" ] || '
        f'{{ echo "gpuops: no python on this host (${{GPUOPS_PY_REASON:-none found}})" >&2; exit {NO_PYTHON_STATUS}; }}\n'
        f'"$GPUOPS_PY" -c {shlex.quote(remote_source())} {shlex.quote(reads)}'
    )
    return Probe("software.python", script, parse_python_packages)


def probes() -> list[Probe[object]]:
    """The software fact's probes: the host itself (sh only) and the chosen python's packages."""
    return [host_system_probe(), python_packages_probe()]


def from_values(values: Mapping[str, object]) -> tuple[HostSystem, PythonPackages]:
    """The software fact from the parsed probe values (a probe that failed: unknown, with its reason)."""
    system = value_or_unknown(values, "host.system", HostSystem, lambda r: HostSystem(None, None, None, None, None, None, r))
    packages = value_or_unknown(values, "software.python", PythonPackages, lambda r: PythonPackages(known=False, reason=r))
    return system, packages


# JSON key -> distribution name
_PACKAGE_KEYS = (("sglang", "sglang"), ("flashinfer", "flashinfer-python"),
                 ("flashinfer_cubin", "flashinfer-cubin"), ("flashinfer_jit_cache", "flashinfer-jit-cache"),
                 ("sgl_kernel", "sgl-kernel"),
                 ("sglang_kernel", "sglang-kernel"), ("torch", "torch"))


class PackageJSON(TypedDict, total=False):
    """One package of the ``software`` key: version, path and source always; torch adds its CUDA and
    full version, sglang its own pins of the stack packages."""

    version: str | None
    path: str | None
    source: str | None
    cuda: str | None
    version_full: str | None
    requires: list[str]


class PythonJSON(TypedDict):
    executable: str | None
    version: str | None
    chosen_because: str | None


class HostPython3JSON(TypedDict):
    path: str | None
    version: str | None


class SoftwareJSON(TypedDict):
    """The ``software`` key of the inspect document (``software_json``)."""

    known: bool
    reason: str | None
    os: str | None
    kernel: str | None
    machine: str | None
    python: PythonJSON
    host_python3: HostPython3JSON
    sglang: PackageJSON | None
    flashinfer: PackageJSON | None
    flashinfer_cubin: PackageJSON | None
    flashinfer_jit_cache: PackageJSON | None
    sgl_kernel: PackageJSON | None
    sglang_kernel: PackageJSON | None
    torch: PackageJSON | None
    nccl: PackageJSON | None
    kernels: dict[str, object] | None  # as the host sent it: every reader checks types


def _package_json(info: PackageInfo | None, with_cuda: bool = False) -> PackageJSON | None:
    if info is None:
        return None
    out: PackageJSON = {"version": info.version, "path": info.path, "source": info.source}
    if with_cuda:
        out["cuda"] = info.cuda
        out["version_full"] = info.version_full
    if info.requires is not None:
        out["requires"] = list(info.requires)  # sglang: its own pins of the stack packages
    return out


def software_json(system: HostSystem, pk: PythonPackages) -> SoftwareJSON:
    """The ``software`` key of the inspect document (docs/inspect-json.md): only ever added to."""
    packages = {key: _package_json(pk.packages.get(dist), with_cuda=key == "torch") for key, dist in _PACKAGE_KEYS}
    return {
        "known": pk.known,
        "reason": pk.reason,
        "os": system.os,
        "kernel": system.kernel,
        "machine": system.machine,
        "python": {
            "executable": pk.python_executable or system.chosen_python,
            "version": pk.python_version,
            "chosen_because": system.chosen_python_reason,
        },
        "host_python3": {"path": system.python3, "version": system.python3_version},
        "sglang": packages["sglang"],
        "flashinfer": packages["flashinfer"],
        "flashinfer_cubin": packages["flashinfer_cubin"],
        "flashinfer_jit_cache": packages["flashinfer_jit_cache"],
        "sgl_kernel": packages["sgl_kernel"],
        "sglang_kernel": packages["sglang_kernel"],
        "torch": packages["torch"],
        "nccl": _package_json(pk.nccl),
        "kernels": dict(pk.kernels) if pk.kernels is not None else None,
    }


def _pkg(name: str, info: PackageJSON | None) -> str:
    if not info:
        return f"{name} -"
    text = f"{name} {info.get('version_full') or info.get('version') or '?'}"
    if info.get("cuda"):
        text += f" (CUDA {info['cuda']})"
    return text


def software_lines(sw: SoftwareJSON) -> list[str]:
    """The report's software lines, from the inspect document (``software_json``)."""
    py = sw["python"]
    host_py = sw["host_python3"]
    lines = [
        f"{sw['os'] or 'unknown OS'}, kernel {sw['kernel'] or '?'}, host python3 "
        f"{host_py['version'] or '-'}",
    ]
    if sw["known"]:
        lines.append(f"python {py['version']} {py['executable']} ({py['chosen_because'] or 'chosen'})")
        nccl = sw["nccl"]
        nccl_text = f"NCCL {nccl['version']} ({nccl['source']})" if nccl else "NCCL -"
        lines.append(", ".join([_pkg("sglang", sw["sglang"]), _pkg("flashinfer", sw["flashinfer"]),
                                _pkg("sgl-kernel", sw["sgl_kernel"]), _pkg("torch", sw["torch"]), nccl_text]))
        if sw["sglang"] and sw["sglang"].get("path"):
            lines.append(f"sglang at {sw['sglang']['path']}")
    else:
        lines.append(f"packages unknown: {sw['reason']}")
    return lines
