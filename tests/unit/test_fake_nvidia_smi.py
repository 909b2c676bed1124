"""The lab's replaying nvidia-smi against the captured fixtures (tests/fixtures) (real H200 capture, synthetic 8x RTX PRO 6000)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.lab import fake_nvidia_smi
from gpuops.lab.gpu_description import load_description, parse_description

FULL_QUERY = (
    "--query-gpu=index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,"
    "pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm"
)
CASES = [("h200-x1", "real/h200-x1"), ("rtx-pro-6000-x8", "synthetic/rtx-pro-6000-server-x8")]


def replay(name: str, captured: bool = True) -> dict:
    desc = dict(load_description(name).replay)
    if not captured:
        desc["captured"] = {}
    return desc


def fixture_text(fixtures_dir: Path, rel: str) -> str:
    with open(fixtures_dir / rel, encoding="utf-8", newline="") as handle:
        return handle.read()


@pytest.mark.parametrize("name,fixture", CASES)
@pytest.mark.parametrize("captured", [True, False])
def test_query_topo_p2p_match_the_fixtures_byte_for_byte(fixtures_dir, name, fixture, captured) -> None:
    # captured=False: the generator alone must reproduce the real capture's format exactly.
    desc = replay(name, captured)
    assert fake_nvidia_smi.run([FULL_QUERY, "--format=csv"], desc) == (0, fixture_text(fixtures_dir, f"{fixture}/query.csv"))
    assert fake_nvidia_smi.run(["topo", "-m"], desc) == (0, fixture_text(fixtures_dir, f"{fixture}/topo.txt"))
    assert fake_nvidia_smi.run(["topo", "-p2p", "r"], desc) == (0, fixture_text(fixtures_dir, f"{fixture}/p2p.txt"))


def test_topo_keeps_the_ansi_underline_escapes() -> None:
    _, text = fake_nvidia_smi.run(["topo", "-m"], replay("rtx-pro-6000-x8"))
    first = text.splitlines()[0]
    assert first.startswith("\t\x1b[4mGPU0\t") and first.endswith("GPU NUMA ID\x1b[0m")
    assert text.splitlines()[1].split("\t")[1:9] == [" X ", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]


def test_plain_nvidia_smi_h200_is_the_capture_and_generated_matches_it_but_the_clock(fixtures_dir) -> None:
    captured = fixture_text(fixtures_dir, "real/h200-x1/smi.txt")
    assert fake_nvidia_smi.run([], replay("h200-x1")) == (0, captured)
    _, generated = fake_nvidia_smi.run([], replay("h200-x1", captured=False), now=0)
    assert generated.splitlines()[1:] == captured.splitlines()[1:]
    assert "Driver Version: 580.159.04" in generated and "CUDA Version: 13.0" in generated


def test_h200_query_and_xml_replay_the_capture(fixtures_dir) -> None:
    assert fake_nvidia_smi.run(["-q"], replay("h200-x1"))[1] == fixture_text(fixtures_dir, "real/h200-x1/smi_q.txt")
    assert fake_nvidia_smi.run(["-q", "-x"], replay("h200-x1"))[1] == fixture_text(fixtures_dir, "real/h200-x1/smi_q.xml")
    assert fake_nvidia_smi.run(["nvlink", "-s"], replay("h200-x1")) == (0, "")


def test_csv_options_noheader_nounits_and_id_selection() -> None:
    desc = replay("rtx-pro-6000-x8")
    status, text = fake_nvidia_smi.run(
        ["--query-gpu=index,memory.total,power.limit", "--format=csv,noheader,nounits", "-i", "5"], desc
    )
    assert (status, text) == (0, "5, 97887, 600.00\n")
    status, text = fake_nvidia_smi.run(["--query-gpu", "name,compute_cap", "--format", "csv,nounits"], desc)
    lines = text.splitlines()
    assert lines[0] == "name, compute_cap" and len(lines) == 9
    assert lines[8] == "NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0"


def test_unknown_field_fails_like_the_real_tool() -> None:
    status, text = fake_nvidia_smi.run(["--query-gpu=index,bogus.field", "--format=csv"], replay("h200-x1"))
    assert status == 2
    assert text == 'Field "bogus.field" is not a valid field to query.\n\n'


def test_driver_failure_description_fails_every_command(tmp_path) -> None:
    desc = dict(replay("rtx-pro-6000-x8"))
    desc["fail"] = "driver"
    for argv in ([], ["-L"], [FULL_QUERY, "--format=csv"], ["topo", "-m"]):
        status, text = fake_nvidia_smi.run(argv, desc)
        assert status == 9
        assert text.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_h100_nvlink_all_pairs() -> None:
    desc = replay("h100-x8")
    _, topo = fake_nvidia_smi.run(["topo", "-m"], desc)
    rows = [line.split("\t") for line in topo.splitlines()[1:9]]
    assert all(rows[i][1 + j] == ("NV18" if i != j else " X ") for i in range(8) for j in range(8))
    _, p2p = fake_nvidia_smi.run(["topo", "-p2p", "r"], desc)
    assert "CNS" not in p2p.split("Legend")[0]
    _, links = fake_nvidia_smi.run(["nvlink", "-s"], desc)
    assert links.count("Link ") == 8 * 18 and "\t Link 17: 26.562 GB/s\n" in links
    _, csv = fake_nvidia_smi.run(["--query-gpu=compute_cap,name", "--format=csv,noheader"], desc)
    assert csv.splitlines() == ["9.0, NVIDIA H100 80GB HBM3"] * 8


def test_list_gpus() -> None:
    assert fake_nvidia_smi.run(["-L"], replay("h200-x1")) == (
        0,
        "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n",
    )


def test_bad_arguments_exit_2() -> None:
    assert fake_nvidia_smi.run(["--frobnicate"], replay("h200-x1"))[0] == 2
    assert fake_nvidia_smi.run(["--query-gpu=name"], replay("h200-x1"))[0] == 2  # no --format
    assert fake_nvidia_smi.run(["--query-gpu=name", "--format=json"], replay("h200-x1"))[0] == 2


def test_mixed_gpus_and_explicit_topology(tmp_path) -> None:
    data = {
        "gpus": [{"gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"},
                 {"gpu_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "compute_capability": "12.0"}],
        "memory_mib": 1000,
        "driver_version": "580.95.05",
        "cuda_driver_version": "13.0",
        "topology": ["X PIX", "PIX X"],
        "p2p_read": [["X", "NS"], ["NS", "X"]],
    }
    desc = parse_description(data, tmp_path / "mixed.yaml").replay
    _, csv = fake_nvidia_smi.run(["--query-gpu=index,compute_cap", "--format=csv,noheader"], desc)
    assert csv == "0, 9.0\n1, 12.0\n"
    assert "GPU0\t X \tPIX\t" in fake_nvidia_smi.run(["topo", "-m"], desc)[1]
    assert " GPU1\tNS\tX\t\n" in fake_nvidia_smi.run(["topo", "-p2p", "r"], desc)[1]


def test_version() -> None:
    status, text = fake_nvidia_smi.run(["--version"], replay("rtx-pro-6000-x8"))
    assert status == 0
    assert text.splitlines() == ["NVIDIA-SMI version  : 580.95.05", "NVML version        : 580.95",
                                 "DRIVER version      : 580.95.05", "CUDA Version        : 13.0"]


def test_the_script_runs_under_python38(tmp_path, fixtures_dir) -> None:
    import json
    import subprocess

    from labtools import require_python

    py38 = require_python("3.8")

    desc_file = tmp_path / "gpu.json"
    desc_file.write_text(json.dumps(replay("rtx-pro-6000-x8")))
    done = subprocess.run([py38, fake_nvidia_smi.__file__, "topo", "-p2p", "r"], capture_output=True, timeout=30,
                          env={"GPUOPS_LAB_GPU": str(desc_file), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == (fixtures_dir / "synthetic/rtx-pro-6000-server-x8/p2p.txt").read_bytes()
