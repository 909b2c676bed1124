"""apply/kept_facts.py: the fingerprint of the GPU summary's inputs changes with every input it names,
and a summary is only ever served for the fingerprint it was gathered under.

The fingerprint script runs for real in sh. Inputs under /proc are replaced inside a private mount
namespace (``unshare --mount`` + bind mounts; the machine's own /proc is never touched), so a reboot,
a driver update and a GPU appearing are all exercised."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuops.apply import kept_facts
from gpuops.apply.kept_facts import FINGERPRINT_PROBE, Guard, Held, setup_script
from gpuops.errors import GpuopsError
from gpuops.facts.software import PythonPackages
from gpuops.gather import ProbeFailure, ProbeKept
from gpuops.inventory import Host


def _fingerprint(dirs: list[str], env: dict[str, str] | None = None, proc: Path | None = None) -> str:
    """$gpuops_facts_fp as the host computes it; with ``proc``, boot_id and /proc/driver come from there."""
    script = setup_script(dirs) + '\nprintf "%s" "$gpuops_facts_fp"'
    run_env = {"PATH": os.environ["PATH"], **(env or {})}
    if proc is None:
        argv = ["sh", "-c", script]
    else:
        mounts = (f"mount --bind {shlex.quote(str(proc / 'boot_id'))} /proc/sys/kernel/random/boot_id && "
                  f"mount --bind {shlex.quote(str(proc / 'driver'))} /proc/driver && ")
        argv = ["unshare", "--mount", "sh", "-c", mounts + script]
    out = subprocess.run(argv, capture_output=True, text=True, env=run_env, check=True, timeout=60).stdout
    assert len(out) in (64, 8, 9, 10) and out.isalnum(), out  # sha256 (or cksum's CRC without sha256sum)
    return out


def _fake_proc(root: Path, boot: str, driver: str, gpus: dict[str, str]) -> Path:
    (root / "driver" / "nvidia" / "gpus").mkdir(parents=True, exist_ok=True)
    (root / "boot_id").write_text(boot + "\n")
    (root / "driver" / "nvidia" / "version").write_text(driver + "\n")
    for bus, info in gpus.items():
        (root / "driver" / "nvidia" / "gpus" / bus).mkdir(exist_ok=True)
        (root / "driver" / "nvidia" / "gpus" / bus / "information").write_text(info)
    return root


def test_reboot_driver_and_gpus_each_change_the_fingerprint(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path / "p", "b1", "NVRM 580.65", {"0000:01:00.0": "Model: RTX PRO 6000\nGPU UUID: GPU-1\n"})
    base = _fingerprint([], proc=proc)
    assert _fingerprint([], proc=proc) == base  # stable
    (proc / "boot_id").write_text("b2\n")
    rebooted = _fingerprint([], proc=proc)
    assert rebooted != base
    (proc / "driver" / "nvidia" / "version").write_text("NVRM 590.10\n")
    updated = _fingerprint([], proc=proc)
    assert updated not in (base, rebooted)
    (proc / "driver" / "nvidia" / "params").write_text("EnableGpuFirmware: 18\n")
    with_params = _fingerprint([], proc=proc)
    (proc / "driver" / "nvidia" / "params").write_text("EnableGpuFirmware: 0\n")  # reloaded with other parameters
    reloaded = _fingerprint([], proc=proc)
    assert len({base, rebooted, updated, with_params, reloaded}) == 5
    _fake_proc(proc, "b2", "NVRM 590.10", {"0000:02:00.0": "Model: H200\nGPU UUID: GPU-2\n"})
    assert _fingerprint([], proc=proc) not in (base, rebooted, updated, with_params, reloaded)  # a GPU more


def test_nvidia_smi_python_and_pythonpath_change_the_fingerprint(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = f"{bin_dir}:{os.environ['PATH']}"
    without = _fingerprint([], env={"PATH": path})
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho one\n")
    smi.chmod(0o755)
    with_smi = _fingerprint([], env={"PATH": path})
    assert with_smi != without
    new = bin_dir / ".nvidia-smi.new"  # a driver update replaces the binary
    new.write_text("#!/bin/sh\necho two\n")
    new.chmod(0o755)
    os.replace(new, smi)
    assert _fingerprint([], env={"PATH": path}) != with_smi
    python = tmp_path / "python3"
    python.write_bytes(b"\x7fELF")  # an interpreter, not a script (a script gets no fingerprint)
    first = _fingerprint([], env={"PATH": path, "GPUOPS_PY": str(python)})
    assert first != _fingerprint([], env={"PATH": path})
    assert _fingerprint([], env={"PATH": path, "GPUOPS_PY": str(python), "PYTHONPATH": "/x"}) != first


def test_a_package_installed_or_removed_in_a_path_dir_changes_the_fingerprint(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "torch-2.9.1.dist-info").mkdir()
    user = tmp_path / "user-site"  # absent now: `pip install --user` creates it
    dirs = [str(site), str(user)]
    before = _fingerprint(dirs)
    assert _fingerprint(dirs) == before
    # pip upgrades torch: a new dist-info, the old one gone (within the same second, too)
    (site / "torch-2.9.1.dist-info").rmdir()
    (site / "torch-2.10.0.dist-info").mkdir()
    upgraded = _fingerprint(dirs)
    assert upgraded != before
    user.mkdir()
    assert _fingerprint(dirs) != upgraded


def test_hostile_directory_names_are_data(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    names = [f"/nonexistent/$(touch {marker})", f"/x'; touch {marker}; '", "/a\nb", f"`touch {marker}`"]
    fingerprint = _fingerprint(names)
    assert not marker.exists()
    assert fingerprint != _fingerprint(names[:-1])


# ------------------------------------------------------------------------------ the summary's life


def _host() -> Host:
    return Host(name="h1", address="127.0.0.1", port=2222, user="u", key_file=None, connection="ssh",
                groups=(), vars={})


def _packages(dirs: tuple[str, ...] = ("/site",)) -> PythonPackages:
    return PythonPackages(known=True, packages={}, search_path=dirs)


SUMMARY = {"compute_capability": "12.0", "cuda": "12.8", "gpu_count": 8, "nvlink": False,
           "p2p_all_pairs": True, "p2p_failed_pairs": []}
FP1, FP2 = "a" * 64, "b" * 64


def _values(fingerprint: str, kept: bool = False, packages: Any = None, query: Any = "ok") -> dict[str, Any]:
    if kept:
        return {FINGERPRINT_PROBE: fingerprint, "gpu.query": ProbeKept("gpu.query"),
                "software.python": ProbeKept("software.python")}
    return {FINGERPRINT_PROBE: fingerprint, "gpu.query": query,
            "software.python": packages if packages is not None else _packages()}


def _guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes: list[Any] | None = None) -> Guard:
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))
    from gpuops.gather import Probe

    return kept_facts.guard(_host(), probes if probes is not None else
                            [Probe("gpu.query", "true", str), Probe("software.python", "true", str)])


def test_first_run_keeps_no_fingerprint_the_second_does_the_third_is_offered(tmp_path: Path, monkeypatch) -> None:
    computed: list[int] = []

    def compute(values: Any) -> dict[str, Any]:
        computed.append(1)
        return dict(SUMMARY)

    first = _guard(tmp_path, monkeypatch)
    assert first.held is None and all(not p.unless for p in first.probes)
    assert kept_facts.summary(first, "h1", _values(FP1), compute) == SUMMARY
    second = _guard(tmp_path, monkeypatch)
    assert second.held == Held(None, ("/site",), SUMMARY)
    assert all(not p.unless for p in second.probes)  # nothing to offer yet: the dirs were unknown to run 1
    assert "/site" in second.probes[0].setup  # now the fingerprint covers the path dirs
    kept_facts.summary(second, "h1", _values(FP2), compute)
    third = _guard(tmp_path, monkeypatch)
    assert third.held == Held(FP2, ("/site",), SUMMARY)
    guarded = [p for p in third.probes if p.name != FINGERPRINT_PROBE]
    assert all(FP2 in p.unless for p in guarded) and len(guarded) == 2
    assert kept_facts.summary(third, "h1", _values(FP2, kept=True), compute) == SUMMARY
    assert len(computed) == 2  # the kept run computed nothing


def test_a_changed_fingerprint_is_gathered_and_kept_anew(tmp_path: Path, monkeypatch) -> None:
    guard = _guard(tmp_path, monkeypatch)
    kept_facts.summary(guard, "h1", _values(FP1), lambda v: dict(SUMMARY))
    kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(FP1), lambda v: dict(SUMMARY))
    hopper = {**SUMMARY, "compute_capability": "9.0"}
    got = kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(FP2), lambda v: dict(hopper))
    assert got == hopper
    assert _guard(tmp_path, monkeypatch).held == Held(FP2, ("/site",), hopper)


def test_new_path_dirs_drop_the_fingerprint_until_it_covers_them(tmp_path: Path, monkeypatch) -> None:
    kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(FP1), lambda v: dict(SUMMARY))
    kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(FP1), lambda v: dict(SUMMARY))
    assert _guard(tmp_path, monkeypatch).held.fingerprint == FP1
    more = _packages(("/site", "/user-site"))
    kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(FP2, packages=more), lambda v: dict(SUMMARY))
    assert _guard(tmp_path, monkeypatch).held == Held(None, ("/site", "/user-site"), SUMMARY)


@pytest.mark.parametrize("case", ["probe failed", "packages unknown", "no capability", "no count", "no fingerprint"])
def test_nothing_is_kept_from_an_incomplete_gather(tmp_path: Path, monkeypatch, case: str) -> None:
    summary = dict(SUMMARY)
    values = _values(FP1)
    if case == "probe failed":
        values["gpu.query"] = ProbeFailure("gpu.query", "nvidia-smi timed out")
    elif case == "packages unknown":
        values["software.python"] = PythonPackages(known=False, reason="no python")
    elif case == "no capability":
        summary["compute_capability"] = None
    elif case == "no count":
        summary["gpu_count"] = None
    else:
        values[FINGERPRINT_PROBE] = None
    for _ in range(3):
        assert kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", values, lambda v: dict(summary)) == summary
    assert _guard(tmp_path, monkeypatch).held is None


def test_kept_without_the_matching_fingerprint_fails_the_host(tmp_path: Path, monkeypatch) -> None:
    """A host answering "kept" for what this client does not hold (a confused or hostile host) gets
    no summary at all, never an old or empty one."""
    guard = _guard(tmp_path, monkeypatch)
    with pytest.raises(GpuopsError, match="h1: the host skipped GPU probes"):
        kept_facts.summary(guard, "h1", _values(FP1, kept=True), lambda v: dict(SUMMARY))
    for _ in range(2):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(FP1), lambda v: dict(SUMMARY))
    held = _guard(tmp_path, monkeypatch)
    with pytest.raises(GpuopsError):
        kept_facts.summary(held, "h1", _values(FP2, kept=True), lambda v: dict(SUMMARY))  # another fingerprint
    partly = _values(FP1, kept=True)
    partly["gpu.query"] = "ok"
    with pytest.raises(GpuopsError):
        kept_facts.summary(held, "h1", partly, lambda v: dict(SUMMARY))  # some kept, some not


@pytest.mark.parametrize("entry", ['{"format": 1', '[]', '{"kind": "gpu-facts"}'])
def test_a_torn_or_foreign_entry_is_not_held(tmp_path: Path, monkeypatch, entry: str) -> None:
    guard = _guard(tmp_path, monkeypatch)
    (tmp_path / "kept" / "facts").mkdir(parents=True, exist_ok=True)
    (tmp_path / "kept" / "facts" / f"{guard.key.digest}.json").write_text(entry)
    assert _guard(tmp_path, monkeypatch).held is None


def test_bad_fingerprint_in_an_entry_is_not_offered_to_the_shell(tmp_path: Path, monkeypatch) -> None:
    import json

    guard = _guard(tmp_path, monkeypatch)
    (tmp_path / "kept" / "facts").mkdir(parents=True, exist_ok=True)
    (tmp_path / "kept" / "facts" / f"{guard.key.digest}.json").write_text(json.dumps(
        {"format": 1, "key": guard.key.digest, "kind": "facts", "fingerprint": "x' ]; rm -rf /; [ '", "dirs": [],
         "summary": {}}))
    assert _guard(tmp_path, monkeypatch).held is None


def test_off_leaves_the_probes_alone(tmp_path: Path, monkeypatch) -> None:
    from gpuops.gather import Probe

    monkeypatch.setenv("GPUOPS_KEEP", "off")
    probes = [Probe("gpu.query", "true", str)]
    guard = kept_facts.guard(_host(), probes)
    assert guard.probes == probes and guard.key is None
    assert kept_facts.summary(guard, "h1", {"gpu.query": "ok"}, lambda v: dict(SUMMARY)) == SUMMARY


def test_flush_cache_offers_nothing_but_keeps_what_it_finds(tmp_path: Path, monkeypatch) -> None:
    for _ in range(2):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(FP1), lambda v: dict(SUMMARY))
    from gpuops.gather import Probe

    probes = [Probe("gpu.query", "true", str), Probe("software.python", "true", str)]
    flushed = kept_facts.guard(_host(), probes, offer=False)
    assert flushed.held is not None and flushed.held.fingerprint == FP1
    assert not any(p.unless for p in flushed.probes)  # the host runs every probe
    fresh = {**SUMMARY, "gpu_count": 4}
    assert kept_facts.summary(flushed, "h1", _values(FP1), lambda v: dict(fresh)) == fresh
    assert _guard(tmp_path, monkeypatch).held == Held(FP1, ("/site",), fresh)


def test_a_wedged_driver_read_is_cut_and_changes_the_fingerprint(tmp_path: Path) -> None:
    """A read under /proc/driver/nvidia that never returns (a wedged driver) must not hang the
    gather: it is cut after 5 s, and what it printed differs, so the full probes run."""
    proc = _fake_proc(tmp_path / "p", "b1", "NVRM 580.65", {})
    healthy = _fingerprint([], proc=proc)
    version = proc / "driver" / "nvidia" / "version"
    version.unlink()
    os.mkfifo(version)  # reading it blocks: no writer ever comes
    assert _fingerprint([], proc=proc) != healthy  # it returned (a hang would hit _fingerprint's 60 s timeout)
