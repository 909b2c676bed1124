"""Is the SGLang stack on a host consistent? (pure)

Checks, from the software facts alone:
- each package the installed SGLang pins in its own dist-info metadata (``Requires-Dist:
  flashinfer_python==0.6.1``, ``sgl-kernel==0.3.21`` / ``sglang-kernel==0.4.4``, ``torch==2.9.1``)
  against the version installed (torch's local build tag ``+cu128`` is not part of the pin);
- the CUDA torch was built for against the newest CUDA the driver supports (a torch for 12.8 under
  a 12.4 driver cannot initialise CUDA);
- FlashInfer missing while a FlashInfer feature is open on the host or asked for by the server.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from gpuops.facts.software import PackageInfo, PythonPackages

_KERNEL_NAMES = ("sgl-kernel", "sglang-kernel")


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def parse_requirement(line: str) -> tuple[str, list[tuple[str, str]]]:
    """``flashinfer_python[cu13]==0.6.12; marker`` -> ("flashinfer-python", [("==", "0.6.12")])."""
    head = line.split(";", 1)[0].strip()
    match = re.match(r"([A-Za-z0-9_.-]+)\s*(\[[^\]]*\])?\s*(.*)$", head)
    if not match:
        return _norm(head), []
    specs = [(m.group(1), m.group(2).strip()) for m in re.finditer(r"(==|>=|<=|!=|~=|<|>)\s*([^,\s]+)", match.group(3))]
    return _norm(match.group(1)), specs


def _release(version: str) -> tuple[int, ...]:
    public = version.split("+", 1)[0]
    parts = []
    for piece in public.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group(0)))
        if digits.group(0) != piece:
            break
    return tuple(parts)


def satisfies(installed: str, op: str, wanted: str) -> bool | None:
    have, want = _release(installed), _release(wanted)
    if not have or not want:
        return None
    width = max(len(have), len(want))
    have, want = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    if op == "==":
        if "+" not in wanted and installed.split("+", 1)[0] != wanted and have == want:
            return True  # 2.9.1 vs 2.9.1.0
        return have == want
    table = {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want, "!=": have != want,
             "~=": have >= want and have[: max(len(_release(wanted)) - 1, 1)] == want[: max(len(_release(wanted)) - 1, 1)]}
    return table.get(op)


def _version(packages: Mapping[str, PackageInfo | None], name: str) -> str | None:
    info = packages.get(name)
    return info.version if info is not None else None


def requirement_problems(sglang_version: str | None, requires: Iterable[str], packages: Mapping[str, PackageInfo | None]) -> list[str]:
    problems = []
    release = f"sglang {sglang_version or '(version unknown)'}"
    for line in requires:
        name, specs = parse_requirement(line)
        if not specs:
            continue
        wanted = ",".join(op + v for op, v in specs)
        installed = _version(packages, name)
        if installed is None and name in _KERNEL_NAMES:
            other = next((n for n in _KERNEL_NAMES if n != name and _version(packages, n)), None)
            if other:
                problems.append(f"{release} requires {name}{wanted}, but {other} {_version(packages, other)} is "
                                f"installed instead (the kernel package was renamed): install {name}{wanted}")
                continue
        if installed is None:
            problems.append(f"{release} requires {name}{wanted}, which is not installed")
            continue
        verdicts = [satisfies(installed, op, v) for op, v in specs]
        if False in verdicts:
            problems.append(f"{release} requires {name}{wanted}; installed: {installed}")
    return problems


def _major_minor(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def cuda_problem(torch_cuda: str | None, driver_cuda: str | None) -> str | None:
    built, driver = _major_minor(torch_cuda), _major_minor(driver_cuda)
    if built and driver and built > driver:
        return (f"torch is built for CUDA {torch_cuda} but the driver supports CUDA {driver_cuda} at most: CUDA will "
                f"not initialise; upgrade the driver or install a torch built for CUDA <= {driver_cuda}")
    return None


def stack_problems(packages: PythonPackages | None, driver_cuda: str | None, flashinfer_wanted: Iterable[str] = ()) -> list[str]:
    """Every inconsistency of the host's stack, one line each (empty when consistent or unknown)."""
    if packages is None or not packages.known:
        return []
    found = dict(packages.packages)
    problems: list[str] = []
    sglang = found.get("sglang")
    if sglang is not None and sglang.requires:
        problems += requirement_problems(sglang.version, sglang.requires, found)
    torch = found.get("torch")
    problem = cuda_problem(torch.cuda if torch is not None else None, driver_cuda)
    if problem:
        problems.append(problem)
    wanted = list(flashinfer_wanted)
    if wanted and not _version(found, "flashinfer-python"):
        problems.append(f"flashinfer is not installed, but {'; '.join(wanted)}: it cannot run")
    return problems


def flashinfer_wanted(features: Mapping[str, Mapping[str, object]], server_args: Mapping[str, object] | None) -> list[str]:
    """Why FlashInfer is needed here: open FlashInfer features, and server flags naming it."""
    reasons = [f"{name} is {f.get('status')}" for name, f in features.items()
               if "flashinfer" in name and (f.get("status") == "open" or f.get("in_effect") is True)]
    for key, value in (server_args or {}).items():
        if "flashinfer" in str(key) and value not in (None, False, "", "none", "false") or \
                (isinstance(value, str) and value.lower().startswith("flashinfer")):
            reasons.append(f"the server is launched with {key}={value}")
    return reasons
