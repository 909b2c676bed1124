"""Software facts: OS, kernel, pythons, and the SGLang stack's versions (sglang, flashinfer,
sgl-kernel, torch + its CUDA, NCCL) as the chosen python ($GPUOPS_PY) sees them."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gpuops.gather import Probe, ProbeOutput

NO_PYTHON_STATUS = 127


@dataclass(frozen=True)
class HostSystem:
    """What the host is, from sh alone (works with no python at all)."""

    os: str | None
    kernel: str | None
    machine: str | None
    python3: str | None  # the host's `python3` on PATH
    python3_version: str | None
    chosen_python: str | None  # $GPUOPS_PY
    chosen_python_reason: str | None  # $GPUOPS_PY_REASON


@dataclass(frozen=True)
class PackageInfo:
    version: str | None
    path: str | None  # the package directory (as `import` would find it)
    source: str | None  # "metadata" | "version.py" | "nvidia-nccl-cu12" | "header" | "library"
    cuda: str | None = None  # torch only: torch.version.cuda
    version_full: str | None = None  # torch only: torch.__version__ ("2.11.0+cu130"), from version.py
    requires: tuple[str, ...] | None = None  # sglang only: its Requires-Dist lines for the stack packages


@dataclass(frozen=True)
class PythonPackages:
    known: bool
    reason: str | None = None
    python_executable: str | None = None
    python_version: str | None = None
    packages: dict[str, PackageInfo | None] = field(default_factory=dict)  # by distribution name
    nccl: PackageInfo | None = None


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


def _package(raw: Any) -> PackageInfo | None:
    if not isinstance(raw, dict):
        return None
    return PackageInfo(
        version=raw.get("version"),
        path=raw.get("path") or raw.get("location"),
        source=raw.get("source"),
        cuda=raw.get("cuda"),
        version_full=raw.get("version_full"),
        requires=tuple(str(r) for r in raw["requires"]) if isinstance(raw.get("requires"), list) else None,
    )


def parse_python_packages(out: ProbeOutput) -> PythonPackages:
    if out.exit_status == NO_PYTHON_STATUS and not out.stdout.strip():
        detail = out.stderr.strip().splitlines()[-1:] or ["no python"]
        return PythonPackages(known=False, reason=detail[0].removeprefix("gpuops: "))
    if out.exit_status != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.exit_status}"])[-1]
        return PythonPackages(known=False, reason=f"the package probe failed (exit status {out.exit_status}): {last[:200]}")
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return PythonPackages(known=False, reason="the package probe printed no JSON")
    python = data.get("python") or {}
    packages = {name: _package(raw) for name, raw in (data.get("packages") or {}).items()}
    return PythonPackages(
        known=True,
        python_executable=python.get("executable"),
        python_version=python.get("version"),
        packages=packages,
        nccl=_package(data.get("nccl")),
    )


def remote_source() -> str:
    return resources.files("gpuops.facts").joinpath("software_remote.py").read_text(encoding="utf-8")


def host_system_probe() -> Probe[HostSystem]:
    return Probe("host.system", HOST_SYSTEM_SCRIPT.strip(), parse_host_system)


def python_packages_probe() -> Probe[PythonPackages]:
    script = (
        '[ -n "${GPUOPS_PY:-}" ] || '
        f'{{ echo "gpuops: no python on this host (${{GPUOPS_PY_REASON:-none found}})" >&2; exit {NO_PYTHON_STATUS}; }}\n'
        f'"$GPUOPS_PY" -c {shlex.quote(remote_source())}'
    )
    return Probe("software.python", script, parse_python_packages)
