"""GPU descriptions, launch files and lab text files: pure parts of the lab."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpuops.errors import GpuopsError
from gpuops.lab import launch_files, lab_files, site
from gpuops.lab.gpu_description import builtin_names, load_description, with_port

MINIMAL = {"gpus": 1, "gpu_name": "X", "compute_capability": "9.0", "memory_mib": 10,
           "driver_version": "1", "cuda_driver_version": "12.8"}


def test_builtins_are_there_and_load() -> None:
    assert {"rtx-pro-6000-x8", "h200-x1", "h100-x8"} <= set(builtin_names())
    rtx = load_description("rtx-pro-6000-x8")
    assert (rtx.gpu_count, rtx.compute_capability) == (8, "12.0")
    assert rtx.packages["nvidia-nccl-cu12"] == "2.27.5"
    assert rtx.server.args[:2] == ("--model-path", "/models/Kimi-K2.5")
    assert rtx.server.env == {"NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1"}
    assert load_description("h100-x8").compute_capability == "9.0"
    assert load_description("none") is None


def test_the_shared_host_yaml_fixture_is_a_valid_description(fixtures_dir) -> None:
    desc = load_description(str(fixtures_dir / "synthetic/rtx-pro-6000-server-x8/host.yaml"))
    assert desc.gpu_count == 8 and desc.replay["topology"][0][4] == "SYS"
    assert desc.replay["p2p_read"][0][4] == "CNS" and desc.replay["p2p_read"][0][3] == "OK"


@pytest.mark.parametrize(
    "change,message",
    [
        ({"gpus": "eight"}, "gpus must be a count"),
        ({"compute_capability": "sm120"}, "compute_capability"),
        ({"memory_mib": -1}, "memory_mib"),
        ({"driver_version": None}, "driver_version is required"),
        ({"fail": "fan"}, "fail must be one of driver"),
        ({"gpus": 2, "topology": ["X NV4", "NV4"]}, "topology row 1"),
        ({"gpus": 2, "numa_nodes": {0: [0]}}, "does not place GPU"),
        ({"server": {"cmdline": "python3 server.py"}}, "sglang.launch_server"),
        ({"captured": {"smi": "missing.txt"}}, "captured.smi"),
    ],
)
def test_bad_descriptions_name_the_file_and_the_problem(tmp_path, change, message) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, **change}))
    with pytest.raises(GpuopsError) as err:
        load_description(str(path))
    assert str(path) in str(err.value) and message in str(err.value)


def test_unknown_name_and_bad_yaml(tmp_path) -> None:
    with pytest.raises(GpuopsError, match="no such file.*builtin: .*h100-x8"):
        load_description("b300-x8")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [1,\n")
    with pytest.raises(GpuopsError, match=r"bad\.yaml:2:1: malformed YAML"):
        load_description(str(bad))


def test_with_port_replaces_in_place_or_appends() -> None:
    assert with_port(["--tp", "8", "--port", "30000", "--x"], 4) == ["--tp", "8", "--port", "4", "--x"]
    assert with_port(["--port=1"], 4) == ["--port=4"]
    assert with_port(["--tp", "1"], 4) == ["--tp", "1", "--port", "4"]


def test_env_file_and_launch_script_round_trip_through_sh(tmp_path) -> None:
    hostile = "a'b \"c\" $(touch pwned) `x` ; d"
    # A fake python that prints its environment value and its argv: both must arrive unchanged.
    fake_python = tmp_path / "fake python"
    fake_python.write_text('#!/bin/sh\nprintf "%s|" "$WEIRD" "$@"\n')
    fake_python.chmod(0o755)
    launch_files.write_launch_files(tmp_path, "h01", str(fake_python), ["--model-path", hostile, "--port", "30001"],
                                    {"NCCL_ALGO": "Ring", "WEIRD": hostile}, 30001)
    assert "NCCL_ALGO='Ring'" in (tmp_path / "sglang.env").read_text().splitlines()
    script = tmp_path / "sglang-launch.sh"
    out = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, cwd=tmp_path).stdout
    assert out == f"{hostile}|-m|sglang.launch_server|--model-path|{hostile}|--port|30001|"
    assert not (tmp_path / "pwned").exists()
    assert shlex.split(script.read_text().splitlines()[-1])[-3] == hostile
    with pytest.raises(GpuopsError, match="BAD-NAME"):
        launch_files.write_launch_files(tmp_path, "h01", str(fake_python), [], {"BAD-NAME": "1"}, 30001)


def test_torch_cuda_version_and_dist_info_names() -> None:
    assert site.torch_cuda_version("2.9.1+cu128") == "12.8"
    assert site.torch_cuda_version("2.11.0+cu130") == "13.0"
    assert site.torch_cuda_version("2.9.1") is None
    assert site.dist_info_name("flashinfer-python", "0.6.1") == "flashinfer_python-0.6.1.dist-info"


def test_inventory_text_has_every_role_variable(tmp_path) -> None:
    host_dir = tmp_path / "h01"
    (host_dir / "state").mkdir(parents=True)
    (host_dir / "state" / "server.json").write_text('{"args": ["--port", "5"], "env": {"A": "1"}, "port": 5}')
    host = SimpleNamespace(name="h01", port=2222, gpu="h200-x1", sglang="0.5.8", server_port=5, groups=("gpu",),
                           state_dir=host_dir / "state", site_dir=host_dir / "site", bin_dir=host_dir / "bin",
                           dir=host_dir)
    data = yaml.safe_load(lab_files.inventory_text(tmp_path, [host], "alice", "/usr/bin/python3"))
    lab = data["all"]["children"]["lab"]
    assert lab["vars"]["gpuops_known_hosts"] == str(tmp_path / "known_hosts")
    assert lab["vars"]["become"] is False
    hv = lab["hosts"]["h01"]
    assert hv["ansible_host"] == "127.0.0.1" and hv["ansible_port"] == 2222 and hv["ansible_user"] == "alice"
    assert hv["sglang_manager"] == "process" and hv["sglang_args"] == ["--port", "5"]
    assert hv["sglang_env"] == {"A": "1"} and hv["sglang_port"] == 5
    assert hv["gpuops_state_dir"] == str(host_dir / "state") and hv["sglang_site"] == str(host_dir / "site")
    assert hv["gpuops_envs_dir"] == str(host_dir / "envs")  # release environments stay inside the lab host
    assert "sglang_wheelhouse" not in hv  # no gpu.json: no wheelhouse for this host
    assert data["all"]["children"]["gpu"] == {"hosts": {"h01": None}}
    # The documented example in the repository names the same variables.
    example = Path(__file__).resolve().parents[2] / "inventory" / "lab.yml"
    documented = example.read_text()
    for var in list(hv) + list(lab["vars"]):
        assert var in documented, var
