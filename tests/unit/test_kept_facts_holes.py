"""apply/kept_facts.py, tried where the first tests did not reach: a summary gathered while an
nvidia-smi call failed must not be kept (it would be served until the next reboot), and the
fingerprint must move with what decides the python's ``sys.path`` besides its directories' stat.

The fingerprint script runs for real in sh, as in tests/unit/test_kept_facts_fingerprint.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuops.apply import kept_facts
from gpuops.apply.kept_facts import FINGERPRINT_PROBE, setup_script
from gpuops.facts.gpu import GpuQuery, SmiBanner
from gpuops.facts.software import PythonPackages
from gpuops.facts.topology import P2PMatrix, TopologyMatrix
from gpuops.gather import Probe
from gpuops.inventory import Host

FP = "c" * 64
TIMED_OUT = "nvidia-smi did not answer within 30 s (wedged GPU or driver?)"


def _host() -> Host:
    return Host(name="h1", address="127.0.0.1", port=2222, user="u", key_file=None, connection="ssh",
                groups=(), vars={})


def _guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> kept_facts.Guard:
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))
    names = ["gpu.query", "gpu.banner", "gpu.procfs", "gpu.topo", "gpu.p2p", "software.python"]
    return kept_facts.guard(_host(), [Probe(name, "true", str) for name in names])


def _values(**failed: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        FINGERPRINT_PROBE: FP,
        "gpu.query": GpuQuery(known=True),
        "gpu.banner": SmiBanner(known=True, driver_version="580.65", cuda_driver_version="13.0"),
        "gpu.procfs": None,
        "gpu.topo": TopologyMatrix(known=True),
        "gpu.p2p": P2PMatrix(known=True),
        "software.python": PythonPackages(known=True, packages={}, search_path=("/site",)),
    }
    values.update(failed)
    return values


# What the summary says when one nvidia-smi call failed: the query falls back to /proc/driver/nvidia
# (capability and count still known), the interconnect is unknown, the CUDA comes from torch.
DEGRADED = {"compute_capability": "12.0", "cuda": "12.8", "gpu_count": 8, "nvlink": None,
            "p2p_all_pairs": None, "p2p_failed_pairs": []}


@pytest.mark.parametrize("probe,value", [
    ("gpu.p2p", P2PMatrix(known=False, reason=TIMED_OUT)),
    ("gpu.topo", TopologyMatrix(known=False, reason=TIMED_OUT)),
    ("gpu.banner", SmiBanner(known=False, reason=TIMED_OUT)),
    ("gpu.query", GpuQuery(known=False, reason=TIMED_OUT)),
])
def test_a_failed_nvidia_smi_call_is_never_kept(tmp_path: Path, monkeypatch, probe: str, value: Any) -> None:
    """An nvidia-smi call that timed out or failed parses to an unknown value (not a ProbeFailure),
    and the summary is still complete enough to look whole; kept, it would be served with its
    unknown interconnect until the next reboot, though the next live gather would read it."""
    for _ in range(3):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(**{probe: value}), lambda v: dict(DEGRADED))
    held = _guard(tmp_path, monkeypatch).held
    assert held is None or held.fingerprint is None
    assert not any(p.unless for p in _guard(tmp_path, monkeypatch).probes)


def test_a_whole_gather_is_still_kept(tmp_path: Path, monkeypatch) -> None:
    whole = {**DEGRADED, "nvlink": False, "p2p_all_pairs": True}
    for _ in range(2):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(), lambda v: dict(whole))
    assert _guard(tmp_path, monkeypatch).held.fingerprint == FP


# --------------------------------------------------------- what decides sys.path besides its dirs


def _fingerprint(dirs: list[str], env: dict[str, str]) -> str:
    script = setup_script(dirs) + '\nprintf "%s" "$gpuops_facts_fp"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, timeout=60,
                         env={"PATH": os.environ["PATH"], **env}).stdout
    assert len(out) in (64, 8, 9, 10) and out.isalnum(), out
    return out


def test_a_python_link_moved_to_another_env_with_the_same_interpreter(tmp_path: Path) -> None:
    """``sglang_python: /opt/bin/python3``, a link to a conda env's python. conda hard-links the
    interpreter into every env (one inode), and that python reports its sys.path resolved (under
    the env), so moving the link to another env changes neither the stat of ``$GPUOPS_PY`` nor any
    directory the last gather reported: only where the link leads."""
    pkgs = tmp_path / "pkgs" / "python3.12"
    pkgs.parent.mkdir()
    pkgs.write_text("an interpreter\n")
    envs = {}
    for name in ("sglang-a", "sglang-b"):
        env_bin = tmp_path / "envs" / name / "bin"
        env_bin.mkdir(parents=True)
        os.link(pkgs, env_bin / "python3.12")
        (tmp_path / "envs" / name / "site").mkdir()
        envs[name] = env_bin / "python3.12"
    link = tmp_path / "bin" / "python3"
    link.parent.mkdir()
    link.symlink_to(envs["sglang-a"])
    dirs = [str(tmp_path / "envs" / "sglang-a" / "site")]
    before = _fingerprint(dirs, {"GPUOPS_PY": str(link)})
    link.unlink()
    link.symlink_to(envs["sglang-b"])
    assert _fingerprint(dirs, {"GPUOPS_PY": str(link)}) != before


def test_a_venv_that_now_includes_the_system_site_packages(tmp_path: Path) -> None:
    """``include-system-site-packages = true`` adds the base python's site dirs (where another torch
    may be) to sys.path; the venv's own directories are unchanged."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/bin/sh")  # any file: only its stat is read
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    cfg = venv / "pyvenv.cfg"
    cfg.write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    env = {"GPUOPS_PY": str(venv / "bin" / "python")}
    before = _fingerprint([str(site)], env)
    cfg.write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    assert _fingerprint([str(site)], env) != before


def test_a_pth_file_rewritten_in_place(tmp_path: Path) -> None:
    """A ``.pth`` file (an editable install's, conda's) rewritten in place adds or moves a sys.path
    directory; its directory's stat and listing stay as they were."""
    site = tmp_path / "site"
    site.mkdir()
    pth = site / "__editable__.sglang-0.5.8.pth"
    pth.write_text("/src/sglang-a/python\n")
    info = os.stat(site)
    before = _fingerprint([str(site)], {})
    with open(pth, "w") as fh:  # in place: same inode, the directory untouched
        fh.write("/src/sglang-b/python\n")
    assert os.stat(site).st_mtime_ns == info.st_mtime_ns
    assert _fingerprint([str(site)], {}) != before


@pytest.mark.parametrize("name", ["HOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONHOME"])
def test_the_environment_that_moves_sys_path(tmp_path: Path, name: str) -> None:
    """The user site dir follows ``$HOME`` (another login user, or become keeping or setting it) and
    ``$PYTHONUSERBASE``; ``$PYTHONNOUSERSITE`` drops it; ``$PYTHONHOME`` moves the standard library
    and site dirs."""
    site = tmp_path / "site"
    site.mkdir()
    first = _fingerprint([str(site)], {name: str(tmp_path / "a")})
    assert _fingerprint([str(site)], {name: str(tmp_path / "b")}) != first


def _fingerprint_with_devices(tmp_path: Path, devices: dict[str, int]) -> str:
    """The fingerprint where /dev holds ``devices`` (name -> minor of an nvidia character device),
    in a private mount namespace over a tmpfs: the machine's own /dev is never touched."""
    make = " && ".join(f"mknod /dev/{name} c 195 {minor}" for name, minor in devices.items()) or "true"
    script = setup_script([]) + '\nprintf "%s" "$gpuops_facts_fp"'
    argv = ["unshare", "--mount", "sh", "-c",
            f"mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && {make} && {script}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60,
                         env={"PATH": os.environ["PATH"]}).stdout
    assert len(out) in (64, 8, 9, 10) and out.isalnum(), out
    return out


def test_a_container_given_other_gpus(tmp_path: Path) -> None:
    """A container (reached at the same address) made again with other GPUs: the same kernel (boot
    id), and /proc/driver/nvidia shows every GPU of the machine where the NVIDIA runtime does not
    mask it (``docker run --device``); nvidia-smi sees only the device nodes the container was given."""
    one = _fingerprint_with_devices(tmp_path, {"nvidia0": 0})
    assert _fingerprint_with_devices(tmp_path, {"nvidia0": 0}) == one  # stable
    assert _fingerprint_with_devices(tmp_path, {"nvidia0": 0, "nvidia1": 1}) != one  # a GPU more
    assert _fingerprint_with_devices(tmp_path, {"nvidia0": 3}) != one  # --device /dev/nvidia3:/dev/nvidia0


def test_a_summary_kept_by_other_gpuops_code_is_not_offered(tmp_path: Path, monkeypatch) -> None:
    """The summary is what gpuops' own parsers made of the probes' output (``facts/arch.py`` naming a
    new GPU's compute capability, the CUDA taken from torch): after an upgrade or a fix of gpuops,
    a summary the old code made must be gathered again, as a kept no-op plan is
    (``memo.package_digest`` in its key), not served until the host reboots."""
    from gpuops import memo

    whole = {**DEGRADED, "nvlink": False, "p2p_all_pairs": True}
    monkeypatch.setattr(memo, "package_digest", lambda: "1" * 64)
    for _ in range(2):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(), lambda v: dict(whole))
    assert any(p.unless for p in _guard(tmp_path, monkeypatch).probes)  # offered while the code is the same
    monkeypatch.setattr(memo, "package_digest", lambda: "2" * 64)  # gpuops upgraded
    assert not any(p.unless for p in _guard(tmp_path, monkeypatch).probes)


def test_a_python_that_is_a_script_is_never_kept(tmp_path: Path) -> None:
    """``sglang_python`` may be a wrapper script, and ``python3`` on PATH a pyenv shim: which python
    it runs comes from what the fingerprint cannot see (a file it reads, ``pyenv global``, an
    environment module's default), and the directories of the python it ran last stay as they were.
    Its fingerprint is empty: the probes run every time and nothing is kept."""
    choice = tmp_path / "active-python"
    choice.write_text("/opt/venv-a/bin/python3\n")
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(f'#!/bin/sh\nexec "$(cat {choice})" "$@"\n')
    wrapper.chmod(0o755)
    script = setup_script([]) + '\nprintf "%s" "$gpuops_facts_fp"'
    env = {"PATH": os.environ["PATH"], "GPUOPS_PY": str(wrapper)}
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, timeout=60, env=env).stdout
    assert out == ""
    elf = tmp_path / "python3"  # a real interpreter (ELF) is fingerprinted as before
    elf.write_bytes(b"\x7fELF" + b"\0" * 60)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, timeout=60,
                         env={**env, "GPUOPS_PY": str(elf)}).stdout
    assert len(out) in (64, 8, 9, 10)


def test_the_same_facts_are_offered_from_any_working_directory(tmp_path: Path, monkeypatch) -> None:
    """A role directory or templates in the working directory change what a plan is made of, not
    what the GPU probes say: the kept facts' key leaves them out (the benchmarks' floors and a user
    running gpuops from two directories offer the same fingerprint)."""
    from gpuops import memo

    whole = {**DEGRADED, "nvlink": False, "p2p_all_pairs": True}
    here, there = tmp_path / "a", tmp_path / "b"
    (there / "roles" / "extra").mkdir(parents=True)
    (there / "roles" / "extra" / "tasks.yml").write_text("[]\n")
    here.mkdir()
    monkeypatch.chdir(here)
    memo.code_digest.cache_clear()
    for _ in range(2):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(), lambda v: dict(whole))
    monkeypatch.chdir(there)
    memo.code_digest.cache_clear()
    assert any(p.unless for p in _guard(tmp_path, monkeypatch).probes)
