"""The nvidia-smi probes: four calls started side by side, each output back in the gather's own
frame; run by /bin/sh here with a stand-in nvidia-smi that prints the real captures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from facts_fixtures import DRIVER_FAILURE, H200, fixture_text

from gpuops.facts import gpu as gpu_fact
from gpuops.facts import topology as topology_fact
from gpuops.facts.gpu import parse_banner, parse_procfs, parse_procfs_output, parse_query
from gpuops.facts.topology import parse_topo
from gpuops.gather import ProbeFailure, ProbeOutput, background_output, build_gather_script, new_nonce, parse_outputs, split_gather_output


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


def _gather(path: str) -> dict:
    """The GPU and interconnect probes in ONE gather script, run by /bin/sh with ``path`` as PATH."""
    probes = gpu_fact.probes() + topology_fact.probes()
    nonce = new_nonce()
    env = dict(os.environ, PATH=path)
    proc = subprocess.run(["/bin/sh", "-s"], input=build_gather_script(probes, nonce), capture_output=True,
                          text=True, env=env, timeout=60)
    return parse_outputs(probes, split_gather_output(proc.stdout, nonce))


def test_all_four_outputs_come_back_byte_for_byte(tmp_path: Path) -> None:
    _fake_smi(tmp_path / "bin")
    values = _gather(f"{tmp_path / 'bin'}:/usr/bin:/bin")
    query, banner = gpu_fact.from_values(values)
    assert query.known and query.gpus[0].sm == "sm90"
    assert (banner.driver_version, banner.cuda_driver_version) == ("580.159.04", "13.0")
    assert values["gpu.topo"].known and values["gpu.topo"].affinity["GPU0"].cpu_affinity == "0-15"
    assert values["gpu.p2p"].known and values["gpu.p2p"].gpus == ("GPU0",)
    assert values["gpu.procfs"] is None  # nvidia-smi is there: no driver listing
    assert values["gpu.topo"] == parse_topo(ProbeOutput(fixture_text(H200, "topo.txt"), "", 0))


def test_the_calls_start_side_by_side_before_any_probe_prints(tmp_path: Path) -> None:
    # Each call is started in the background first; the probes only print what the calls wrote.
    script = build_gather_script(gpu_fact.probes() + topology_fact.probes(), "n")
    starts = [i for i, line in enumerate(script.splitlines()) if line.endswith(") </dev/null >/dev/null 2>&1 &")]
    first_frame = next(i for i, line in enumerate(script.splitlines()) if "@@gpuops:n begin" in line)
    assert len(starts) == 4 and max(starts) < first_frame
    assert script.count("wait $gpuops_bg") == 1


def test_one_call_failing_fails_only_that_fact(tmp_path: Path) -> None:
    _fake_smi(tmp_path / "bin", topo_fails=True)
    values = _gather(f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert gpu_fact.from_values(values)[0].known and values["gpu.p2p"].known
    assert values["gpu.topo"].known is False and "exit status 9" in values["gpu.topo"].reason


def test_missing_nvidia_smi_fails_every_fact_with_the_reason(tmp_path: Path) -> None:
    values = _gather("/usr/bin:/bin")
    query, banner = gpu_fact.from_values(values)
    for fact in (query, banner, values["gpu.topo"], values["gpu.p2p"]):
        assert fact.known is False and "nvidia-smi not found" in fact.reason


def test_a_probe_that_never_came_back_is_unknown_with_the_gathers_reason() -> None:
    failure = ProbeFailure("gpu.query", "the gather script stopped early: Killed")
    query, banner = gpu_fact.from_values({"gpu.query": failure})
    assert query.known is False and query.reason == failure.reason
    assert banner.known is False and banner.reason == "probe gpu.banner did not run"
    interconnect = topology_fact.from_values({"gpu.p2p": ProbeFailure("gpu.p2p", "boom")})
    assert interconnect.known is False and interconnect.p2p_reason == "boom"


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


def test_procfs_listing_answers_when_nvidia_smi_is_missing() -> None:
    missing = ProbeOutput("", "gpuops: nvidia-smi: not found on PATH\n", 127)
    values = {"gpu.query": parse_query(missing), "gpu.banner": parse_banner(missing), "gpu.topo": parse_topo(missing),
              "gpu.procfs": parse_procfs_output(ProbeOutput(PROCFS, "", 0))}
    query, banner = gpu_fact.from_values(values)
    assert query.known and len(query.gpus) == 2
    assert banner.driver_version == "580.159.04"
    assert topology_fact.from_values(values).known is False
    assert "not found" in topology_fact.from_values(values).reason


def test_real_driver_version_file_of_the_h200() -> None:
    misc = fixture_text(H200, "misc.txt")
    version_line = misc.splitlines()[0]  # the capture's /proc/driver/nvidia/version
    _, banner = parse_procfs(f"== /proc/driver/nvidia/version\n{version_line}\n", "x")
    assert banner.driver_version == "580.159.04"


def test_a_call_that_left_no_status_reads_as_a_failure(tmp_path: Path) -> None:
    # The call was killed before it wrote its status (empty file, or none): exit 1, never `exit ""`.
    (tmp_path / "gpu.topo.rc").write_text("")
    env = dict(os.environ, gpuops_tmp=str(tmp_path))
    done = subprocess.run(["/bin/sh", "-c", background_output("gpu.topo")], capture_output=True, text=True, env=env, timeout=30)
    assert (done.returncode, done.stderr) == (1, "")
    (tmp_path / "gpu.topo.rc").unlink()
    done = subprocess.run(["/bin/sh", "-c", background_output("gpu.topo")], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 1
    assert parse_topo(ProbeOutput(done.stdout, done.stderr, done.returncode)).reason.startswith("nvidia-smi exited with status 1")


def test_a_wedged_call_is_cut_at_its_timeout_and_fails_only_that_fact(tmp_path: Path, monkeypatch) -> None:
    # nvidia-smi hanging on a wedged GPU must not hold the whole gather (every fact) until the exec's timeout.
    from gpuops.facts import smi_command

    _fake_smi(tmp_path / "bin")
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.write_text(fake.read_text().replace('"topo -m") cat', '"topo -m") exec sleep 30; cat'))
    monkeypatch.setattr(smi_command, "SMI_TIMEOUT_S", 1)
    values = _gather(f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert gpu_fact.from_values(values)[0].known and values["gpu.p2p"].known
    assert values["gpu.topo"].known is False and "did not answer within 1 s" in values["gpu.topo"].reason
