"""The GPU facts an apply plans from, kept at home while the host's fingerprint of them holds.

A role that patches gates plans its applicability from a summary of the host's GPUs and stack
(compute capability, GPU count, NVLink, P2P pairs, the CUDA of torch or the driver:
``apply/host_gather.gpu_summary``). Gathering it runs ``nvidia-smi`` four times and the package probe, the
largest share of a no-op apply's time on the host (real ``nvidia-smi`` initialises NVML on every call),
to find, again, what the last run found. So the summary is kept per host with a fingerprint of
everything it is read from (and gpuops' code, which made it: ``host_key``), and the next apply offers
that fingerprint: the host computes it again in sh (no python, no NVML) and, when it matches, skips
those probes and says "kept".

The fingerprint (``setup_script``) covers:
- the boot (``/proc/sys/kernel/random/boot_id``): GPUs, the PCI topology, P2P and NVLink are set up
  at boot (or by a driver reload, below). What the driver holds without showing it in a file is not
  covered: a GPU that fails or is reset, an NVLink that goes down, the NVSwitch fabric manager's
  state (no sh-readable sign of them without NVML); after such an event ``--flush-cache`` or a reboot;
- the driver (``/proc/driver/nvidia/version``, its module parameters and registry keys, which a
  reload may change: ``params``, ``registry``) and each GPU the driver sees
  (``/proc/driver/nvidia/gpus/*/information``: model, bus, UUID, whether it is excluded; static per GPU);
- the GPU device nodes ``/dev/nvidia[0-9]*`` (name, major, minor: a container's GPUs);
- the ``nvidia-smi`` on PATH (path, size, mtime, ctime, inode);
- the python the probes run with (``$GPUOPS_PY``, its stat and where a link to it leads, the venv's
  ``pyvenv.cfg``, ``$PYTHONPATH``, and ``$HOME``, ``$PYTHONHOME``, ``$PYTHONUSERBASE``,
  ``$PYTHONNOUSERSITE``, which move its site dirs) and every directory on its ``sys.path`` as the
  last full gather reported it, plus the user site dir (size, link count, mtime and ctime to the
  nanosecond, inode, the names in it, and the text of its ``.pth`` files and ``sitecustomize.py`` /
  ``usercustomize.py``: installing, upgrading or removing a package, or a ``.pth`` adding a directory,
  changes its directory; a wheel's dist-info name carries its version, local label included).

A python that is a script (a wrapper, a pyenv shim) gets no fingerprint: what it runs is decided
where the fingerprint cannot see. The directories come from the previous gather, so a first run keeps the summary without a fingerprint
and the second computes one over the directories it now knows; from the third run on, a no-op skips
the probes. Nothing is kept from a gather where a probe failed or any of its values is unknown (one
``nvidia-smi`` call that timed out or failed, a transient state, must not stick until the next reboot),
nor for a server in a container (its stack is read inside the container). Kept by the memo layer
(``memo.Kind.FACTS``; ``GPUOPS_KEEP=off`` turns it off); ``inspect host`` never uses it
(it reports live values such as memory in use).
"""

from __future__ import annotations

import logging
import re
import shlex
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuops import memo
from gpuops.errors import GpuopsError
from gpuops.facts.software import PythonPackages
from gpuops.gather import Probe, ProbeFailure, ProbeKept
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.gather import Probe
    from gpuops.inventory import Host

MAX_DIRS = 64  # sys.path entries fingerprinted; a longer path is cut (then never kept: see summary())
FINGERPRINT_PROBE = "apply.facts_fingerprint"
_VAR = "gpuops_facts_fp"
_HEX = re.compile(r"^[0-9a-f]{8,64}$")
_LOG = "gpuops.transport"  # shown with -v, as the commands are


def _guarded(name: str) -> bool:
    """The probes whose values the kept summary stands for (``apply/host_gather.gpu_probes_for``)."""
    return name.startswith("gpu.") or name == "software.python"


@frozen
class Held:
    """What this client keeps for a host: the fingerprint (None until a run could compute it over
    the directories below), the sys.path directories to stat, and the summary."""

    fingerprint: str | None
    dirs: tuple[str, ...]
    summary: dict[str, Any] = field(default_factory=dict)


@frozen
class Guard:
    """The probes to send for one host, and what was held when they were built."""

    probes: list["Probe[Any]"]
    held: Held | None
    key: memo.Key | None  # None: keeping is off


def host_key(host: "Host") -> memo.Key | None:
    """The host, and gpuops' own code: the summary is what its parsers made of the probes' output,
    so after an upgrade or a fix it is gathered again. Not the roles or the working directory
    (``memo.package_digest``): a command run from another directory offers the same facts. What
    the summary is read from is the fingerprint the host computes, kept in the entry."""
    return memo.key(memo.Kind.FACTS, memo.package_digest(), host.name, host.address, host.port, host.user,
                    host.connection)


def setup_script(dirs: Sequence[str]) -> str:
    """sh that sets ``$gpuops_facts_fp`` to the digest of the summary's inputs (module docstring).
    Every value from elsewhere (the directories) is quoted; what a read cannot find is named, so
    a file appearing later changes the digest."""
    # %y/%z: mtime and ctime to the nanosecond (GNU and busybox stat alike); a directory's listing
    # too, as two entries changed within one timestamp tick would leave its times as they were.
    stat = "stat -L -c '%n %s %h %y %z %i'"
    quoted = " ".join(shlex.quote(d) for d in dirs)
    # A wedged driver can block a read under /proc/driver/nvidia as it blocks nvidia-smi: each read is
    # cut after 5 s where `timeout` exists (what it printed then differs: a miss, and the full probes
    # run under their own timeouts).
    lines = [
        "gpuops_t=; command -v timeout >/dev/null 2>&1 && gpuops_t='timeout 5'",
        f"{_VAR}=$( {{",
        "  echo 'gpuops facts fingerprint 2'",
        "  cat /proc/sys/kernel/random/boot_id || echo 'no boot id'",
        "  $gpuops_t cat /proc/driver/nvidia/version /proc/driver/nvidia/params /proc/driver/nvidia/registry || echo 'no nvidia driver'",
        # Every GPU's file in one read (tail names each when there are several): one process, not two a GPU.
        "  $gpuops_t tail -n +1 /proc/driver/nvidia/gpus/*/information",
        # The GPU device nodes (name, major and minor): a container is given GPUs by them, and sees the
        # machine's boot id and, unless the NVIDIA runtime masks it, its whole /proc/driver/nvidia.
        "  stat -c '%n %t %T' /dev/nvidia[0-9]* || echo 'no nvidia devices'",
        f"  if gpuops_f=$(command -v nvidia-smi); then {stat} \"$gpuops_f\" || echo \"unreadable $gpuops_f\"; else echo 'no nvidia-smi'; fi",
        f"  echo \"python ${{GPUOPS_PY:-}} PYTHONPATH=${{PYTHONPATH:-}}\"; [ -z \"${{GPUOPS_PY:-}}\" ] || {stat} \"$GPUOPS_PY\"",
        # What else decides sys.path: where a link to the python leads (a conda env's interpreter
        # is one hard-linked inode in every env), a venv's pyvenv.cfg (include-system-site-packages),
        # and the environment the user site dir and the prefix follow.
        "  [ -z \"${GPUOPS_PY:-}\" ] || readlink -f \"$GPUOPS_PY\"",
        "  echo \"HOME=${HOME:-} PYTHONHOME=${PYTHONHOME-unset} PYTHONUSERBASE=${PYTHONUSERBASE-unset} PYTHONNOUSERSITE=${PYTHONNOUSERSITE-unset}\"",
    ]
    if dirs:
        # Named (printf is a builtin), then two processes for all of them; an absent one prints nothing.
        lines.append(f"  printf 'dir %s\\n' {quoted}; {stat} {quoted}; ls -a {quoted}")
    # One cat: the venv's pyvenv.cfg, and the .pth files (and site's customize modules) of each
    # directory, which rewritten in place add or move directories without touching their own
    # directory's stat or listing.
    pth = " ".join(f"{shlex.quote(d)}/*.pth {shlex.quote(d)}/sitecustomize.py {shlex.quote(d)}/usercustomize.py"
                   for d in dirs)
    lines.append(f"  cat \"${{GPUOPS_PY%/*}}/pyvenv.cfg\" \"${{GPUOPS_PY%/*}}/../pyvenv.cfg\" {pth}".rstrip())
    lines += [
        "} 2>/dev/null | { sha256sum 2>/dev/null || cksum; } )",
        f"{_VAR}=${{{_VAR}%% *}}",
        # A python that is a script (a wrapper named by sglang_python, a pyenv shim on PATH) picks
        # the interpreter it runs from what this cannot see (a file it reads, `pyenv global`): no
        # fingerprint, so its probes always run and nothing is kept.
        f"case $(head -c 2 \"${{GPUOPS_PY:-/dev/null}}\" 2>/dev/null) in '#!'*) {_VAR}= ;; esac",
    ]
    return "\n".join(lines)


def read_held(key: memo.Key) -> Held | None:
    data = memo.get(key)
    if data is None:
        return None
    fingerprint, dirs, summary = data.get("fingerprint"), data.get("dirs"), data.get("summary")
    if fingerprint is not None and not (isinstance(fingerprint, str) and _HEX.match(fingerprint)):
        return None
    if not (isinstance(dirs, list) and all(isinstance(d, str) for d in dirs) and isinstance(summary, dict)):
        return None
    return Held(fingerprint, tuple(dirs), summary)


def guard(host: "Host", probes: Sequence["Probe[Any]"], offer: bool = True) -> Guard:
    """``probes`` (the GPU and package probes) plus the fingerprint probe; each skipped on the host
    when the fingerprint matches the one kept. Unchanged probes when keeping is off. ``offer=False``
    (``--flush-cache``): nothing is skipped, and what is gathered is kept as on any run."""

    key = host_key(host) if memo.root() is not None else None
    if key is None:
        return Guard(list(probes), None, None)
    held = read_held(key)
    setup = setup_script(held.dirs if held else ())
    fingerprint_probe = Probe(FINGERPRINT_PROBE, f'printf "%s\\n" "${_VAR}"', _parse_fingerprint, setup=setup)
    out: list[Probe[Any]] = [fingerprint_probe]
    for probe in probes:
        if offer and held is not None and held.fingerprint and _guarded(probe.name):
            probe = replace(probe, setup=setup, unless=f'[ "${_VAR}" = {shlex.quote(held.fingerprint)} ]')
        out.append(probe)
    return Guard(out, held, key)


def _parse_fingerprint(out: Any) -> str | None:
    text = out.stdout.strip()
    return text if _HEX.match(text) else None


def summary(guard_: Guard, host_name: str, values: Mapping[str, Any],
            compute: Callable[[Mapping[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """The GPU summary: the kept one when the host skipped the probes, else ``compute(values)``
    (then kept for the next run when everything it was read from is known)."""

    fingerprint = values.get(FINGERPRINT_PROBE)
    guarded = {name: value for name, value in values.items() if _guarded(name)}
    kept = [name for name, value in guarded.items() if isinstance(value, ProbeKept)]
    held = guard_.held
    if kept:
        if held is None or not held.fingerprint or fingerprint != held.fingerprint or len(kept) != len(guarded):
            raise GpuopsError(f"{host_name}: the host skipped GPU probes ({', '.join(sorted(kept))}) "
                              "for a fingerprint this client does not hold; rerun with --flush-cache")
        logging.getLogger(_LOG).info("%s: GPU facts: fingerprint unchanged (%s), used the summary kept at home",
                                     host_name, held.fingerprint[:16])
        return dict(held.summary)
    result = compute(values)
    if guard_.key is None or not isinstance(fingerprint, str):
        return result
    packages = guarded.get("software.python")
    # A call that failed or timed out parses to a value that says it is unknown (not a ProbeFailure),
    # and the summary still looks whole (an unknown interconnect, the CUDA of torch): kept, that
    # would be served until the next reboot, though the next live gather may read it.
    if any(isinstance(v, ProbeFailure) or getattr(v, "known", True) is not True for v in guarded.values()) \
            or not isinstance(packages, PythonPackages) or not result or result.get("compute_capability") is None \
            or result.get("gpu_count") is None:
        return result  # not every input known: gathered again next time
    dirs = tuple(packages.search_path[:MAX_DIRS])
    complete = len(packages.search_path) <= MAX_DIRS
    # The host digested the directories this client held; the digest stands for this summary
    # only when those are the directories the probe now reports.
    same_dirs = held is not None and held.dirs == dirs
    memo.put(guard_.key, {
        "host": host_name, "fingerprint": fingerprint if (same_dirs and complete) else None,
        "dirs": list(dirs), "summary": result})
    return result
