"""The nvidia-smi batch: four calls side by side, each output framed back; run by /bin/sh here
with a stand-in nvidia-smi that prints the real captures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from facts_fixtures import DRIVER_FAILURE, H200, fixture_text

from gpuops.facts.gpu import parse_procfs
from gpuops.facts.gpu_probe import parse_smi, smi_probe
from gpuops.gather import ProbeOutput


def _fake_smi(bin_dir: Path, topo_fails: bool = False) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("query.csv", "smi.txt", "topo.txt", "p2p.txt"):
        (bin_dir / name).write_text(fixture_text(H200, name), newline="")
    topo = f'printf "%s" "{DRIVER_FAILURE}"; exit 9' if topo_fails else f'cat "{bin_dir}/topo.txt"'
    script = f"""#!/bin/sh
case "$*" in
  --query-gpu=*) cat "{bin_dir}/query.csv" ;;
  "topo -m") {topo} ;;
  "topo -p2p r") cat "{bin_dir}/p2p.txt" ;;
  "") cat "{bin_dir}/smi.txt" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""
    (bin_dir / "nvidia-smi").write_text(script)
    (bin_dir / "nvidia-smi").chmod(0o755)


def _run(script: str, path: str) -> ProbeOutput:
    env = dict(os.environ, PATH=path)
    proc = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    return ProbeOutput(proc.stdout, proc.stderr, proc.returncode)


def test_all_four_outputs_come_back_byte_for_byte(tmp_path: Path) -> None:
    _fake_smi(tmp_path / "bin")
    probe = smi_probe()
    smi = probe.parse(_run(probe.script, f"{tmp_path / 'bin'}:/usr/bin:/bin"))
    assert smi.query.known and smi.query.gpus[0].sm == "sm90"
    assert (smi.banner.driver_version, smi.banner.cuda_driver_version) == ("580.159.04", "13.0")
    assert smi.topo.known and smi.topo.affinity["GPU0"].cpu_affinity == "0-15"
    assert smi.p2p.known and smi.p2p.gpus == ("GPU0",)


def test_one_call_failing_fails_only_that_fact(tmp_path: Path) -> None:
    _fake_smi(tmp_path / "bin", topo_fails=True)
    probe = smi_probe()
    smi = probe.parse(_run(probe.script, f"{tmp_path / 'bin'}:/usr/bin:/bin"))
    assert smi.query.known and smi.p2p.known
    assert smi.topo.known is False and "exit status 9" in smi.topo.reason


def test_missing_nvidia_smi_fails_every_fact_with_the_reason(tmp_path: Path) -> None:
    probe = smi_probe()
    smi = probe.parse(_run(probe.script, "/usr/bin:/bin"))
    for fact in (smi.query, smi.banner, smi.topo, smi.p2p):
        assert fact.known is False and "nvidia-smi not found" in fact.reason


def test_output_cannot_forge_a_frame(tmp_path: Path) -> None:
    # A probe built earlier has another token: frames in the output with a guessed token are text.
    probe = smi_probe()
    forged = "\n@@gpuops-smi:000000000000 query 0\nindex, name\n0, Fake\n@@gpuops-smi:000000000000 err\n"
    smi = probe.parse(ProbeOutput(forged, "", 0))
    assert smi.query.known is False


# The format of a real H200 host's files (seen on the device machine), for an 8x RTX PRO 6000 box.
PROCFS = """== /proc/driver/nvidia/version
NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  
GCC version:  gcc version 15.3.0 (GCC) 
== /proc/driver/nvidia/gpus/0000:2a:00.0/information
Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition
IRQ:   \t\t 180
GPU UUID: \t GPU-00000001-0000-0000-0000-000000000000
Bus Location: \t 0000:2a:00.0
Device Minor: \t 1
== /proc/driver/nvidia/gpus/0000:18:00.0/information
Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition
GPU UUID: \t GPU-00000000-0000-0000-0000-000000000000
Bus Location: \t 0000:18:00.0
Device Minor: \t 0
"""


def test_without_nvidia_smi_the_driver_proc_listing_still_names_the_gpus() -> None:
    query, banner = parse_procfs(PROCFS, "nvidia-smi not found on PATH (no NVIDIA driver installed?)")
    assert query.known and query.source == "procfs"
    assert [g.index for g in query.gpus] == [0, 1]
    assert [g.pci_bus_id for g in query.gpus] == ["0000:18:00.0", "0000:2a:00.0"]
    assert {(g.sm, g.sm_source) for g in query.gpus} == {("sm120", "name")}
    assert query.gpus[1].uuid == "GPU-00000001-0000-0000-0000-000000000000"
    assert "compute capability guessed" in query.note and "/proc/driver/nvidia" in query.note
    assert banner.driver_version == "580.159.04" and banner.cuda_driver_version is None


def test_procfs_frame_travels_with_the_missing_nvidia_smi_answer() -> None:
    token = "abcdef012345"
    framed = f"\n@@gpuops-smi:{token} procfs 0\n{PROCFS}\n@@gpuops-smi:{token} err\n"
    smi = parse_smi(ProbeOutput(framed, "gpuops: nvidia-smi: not found on PATH\n", 127), token)
    assert smi.query.known and len(smi.query.gpus) == 2
    assert smi.banner.driver_version == "580.159.04"
    assert smi.topo.known is False and "not found" in smi.topo.reason


def test_real_driver_version_file_of_the_h200() -> None:
    misc = fixture_text(H200, "misc.txt")
    version_line = misc.splitlines()[0]  # the capture's /proc/driver/nvidia/version
    _, banner = parse_procfs(f"== /proc/driver/nvidia/version\n{version_line}\n", "x")
    assert banner.driver_version == "580.159.04"
