"""The lab end to end: real sshd per host, the replaying nvidia-smi over real SSH, the SGLang site,
the stand-in server run by the process manager, `gpuops lab up|status|down` and leaving nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpuops.errors import GpuopsError
from gpuops.lab import processes
from gpuops.lab.hosts import LabSpec, lab_status, load_lab, start_lab, stop_lab
from gpuops.lab.sglang_cache import sglang_site

pytestmark = pytest.mark.integration

FULL_QUERY = (
    "--query-gpu=index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,"
    "pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm"
)


def ssh(lab, host: str, command: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(lab.ssh_command(host, command), capture_output=True, timeout=60, **kw)


@pytest.fixture(scope="module")
def mixed_lab(lab_factory):
    return lab_factory(
        LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", server=True),
        LabSpec(gpu="h200-x1", sglang="0.5.8", server=False),
        LabSpec(gpu="none", sglang=None, server=False),
    )


def test_nvidia_smi_over_ssh_returns_the_fixture_bytes(mixed_lab, fixtures_dir) -> None:
    for host, fixture in (("h01", "synthetic/rtx-pro-6000-server-x8"), ("h02", "real/h200-x1")):
        done = ssh(mixed_lab, host, f"nvidia-smi {FULL_QUERY} --format=csv")
        assert done.returncode == 0, done.stderr
        assert done.stdout == (fixtures_dir / fixture / "query.csv").read_bytes()
        topo = ssh(mixed_lab, host, "nvidia-smi topo -m")
        assert topo.stdout == (fixtures_dir / fixture / "topo.txt").read_bytes()
        assert b"\x1b[4mGPU0" in topo.stdout and b"\x1b[0m" in topo.stdout


def test_host_without_nvidia_smi(mixed_lab) -> None:
    done = ssh(mixed_lab, "h03", "nvidia-smi -L")
    assert done.returncode == 127 and b"not found" in done.stderr


def test_driver_failure_description_fails_like_the_real_tool(lab_factory, tmp_path) -> None:
    from gpuops.lab.gpu_description import BUILTIN_DIR

    broken = tmp_path / "broken.yaml"
    data = yaml.safe_load((BUILTIN_DIR / "h100-x8.yaml").read_text())
    broken.write_text(yaml.safe_dump({**data, "fail": "driver"}))
    lab = lab_factory(gpu=str(broken), sglang=None, server=False)
    done = ssh(lab, "h01", "nvidia-smi --query-gpu=name --format=csv")
    assert done.returncode == 9
    assert done.stdout.startswith(b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")


def test_session_environment_and_sglang_site(mixed_lab) -> None:
    host = mixed_lab.host("h01")
    script = (
        'echo "$HOME|$GPUOPS_LAB_HOST|$PYTHONPATH"; '
        "python3 -c 'import importlib.metadata as m, torch.version as v; "
        'print(m.version("sglang"), m.version("flashinfer-python"), m.version("sgl-kernel"), '
        'm.version("torch"), v.cuda, m.version("nvidia-nccl-cu12"))\''
    )
    done = ssh(mixed_lab, "h01", script, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{host.home}|h01|{host.site_dir}"
    assert lines[1] == "0.5.8 0.6.1 0.3.21 2.9.1+cu128 12.8 2.27.5"
    # The SGLang source is the real release's, hard-linked from the cache (same inode).
    cached = sglang_site("0.5.8") / "sglang" / "srt" / "server_args.py"
    mine = host.site_dir / "sglang" / "srt" / "server_args.py"
    assert mine.read_bytes() == cached.read_bytes() and os.stat(mine).st_ino == os.stat(cached).st_ino
    assert "#define NCCL_MINOR 27" in (host.site_dir / "nvidia/nccl/include/nccl.h").read_text()


def test_server_runs_with_the_description_flags_and_restarts_over_ssh(lab_factory) -> None:
    from gpuops import shipping

    lab = lab_factory(gpu="rtx-pro-6000-x8", server_env={"GPUOPS_STANDIN_TOKENS_PER_S": "50"})
    host = lab.hosts[0]
    [status] = lab_status(lab)
    assert status.server_running and status.server_healthy and status.sshd_alive
    cmdline = Path(f"/proc/{status.server_pid}/cmdline").read_bytes().split(b"\0")
    assert b"sglang.launch_server" in cmdline and b"EAGLE3" in cmdline
    assert cmdline[cmdline.index(b"--port") + 1] == str(host.server_port).encode()
    info = ssh(lab, host.name, f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{host.server_port}/get_server_info').read().decode())\"")
    server_info = json.loads(info.stdout)
    assert server_info["tp_size"] == 8 and server_info["simulated"] is True
    env = (host.state_dir / "sglang.env").read_text()
    assert "NCCL_P2P_LEVEL='SYS'" in env and "GPUOPS_STANDIN_TOKENS_PER_S='50'" in env
    payload = {"action": "restart", "state_dir": str(host.state_dir), "port": host.server_port, "grace": 5}
    done = subprocess.run(
        lab.ssh_command(host.name, shipping.python_command("python3")),
        input=shipping.python_stdin("process_manager", payload), capture_output=True, timeout=60,
    )
    result = json.loads(done.stdout)
    assert result["healthy"] and result["pid"] != status.server_pid


def test_host_keys_are_verified(mixed_lab, tmp_path) -> None:
    host = mixed_lab.hosts[0]
    wrong = tmp_path / "known_hosts"
    other_key = mixed_lab.hosts[1].dir / "ssh_host_ed25519_key.pub"
    wrong.write_text(f"[127.0.0.1]:{host.port} " + " ".join(other_key.read_text().split()[:2]) + "\n")
    done = subprocess.run(
        ["ssh", "-F", str(mixed_lab.ssh_config), "-o", f"UserKnownHostsFile={wrong}", host.name, "true"],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in done.stderr


def test_inventory_loads_and_holds_the_host_vars(mixed_lab) -> None:
    from gpuops.inventory import load_inventory

    hosts = {h.name: h for h in load_inventory(str(mixed_lab.inventory_path)).select(None)}
    assert set(hosts) == {"h01", "h02", "h03"}
    h01 = hosts["h01"]
    assert (h01.address, h01.port) == ("127.0.0.1", mixed_lab.host("h01").port)
    assert h01.vars["sglang_manager"] == "process" and h01.vars["sglang_port"] == mixed_lab.host("h01").server_port
    assert h01.vars["gpuops_known_hosts"] == str(mixed_lab.known_hosts)
    assert "sglang_site" not in hosts["h03"].vars
    # `apply sglang-release` takes a lab host as it takes a host without an index: the inventory names
    # a wheelhouse holding the release advise names and the host's own, with stand-ins for their pins,
    # torch built for the host's driver (13.0); environments go inside the host's own directory.
    lab_h01 = mixed_lab.host("h01")
    assert h01.vars["gpuops_envs_dir"] == str(lab_h01.dir / "envs")
    wheels = {p.name for p in Path(h01.vars["sglang_wheelhouse"]).iterdir()}
    assert {w.split("-")[1] for w in wheels if w.startswith("sglang-")} == {"0.5.23", "0.5.8"}, sorted(wheels)
    assert any(w.startswith("torch-") and "+cu130-" in w for w in wheels), sorted(wheels)
    assert "sglang_wheelhouse" not in hosts["h03"].vars  # no SGLang: nothing to move to another release


def test_sixteen_hosts_come_up_answer_and_leave_nothing_behind(tmp_path) -> None:
    root = tmp_path / "lab16"
    lab = start_lab(root, [LabSpec(gpu="h100-x8", count=16)])
    try:
        assert len({h.port for h in lab.hosts}) == 16
        # Every host answers over its own sshd (in parallel, like gpuops does).
        procs = [subprocess.Popen(lab.ssh_command(h.name, "echo $GPUOPS_LAB_HOST; nvidia-smi -L | wc -l"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for h in lab.hosts]
        outs = [p.communicate(timeout=60)[0].decode().split() for p in procs]
        assert outs == [[h.name, "8"] for h in lab.hosts]
        statuses = lab_status(lab)
        assert all(s.sshd_alive and s.server_running and s.server_healthy for s in statuses)
        pids = [h.sshd_pid for h in lab.hosts] + [s.server_pid for s in statuses]
        # A session left running (sleep) must be cleaned up by stop too.
        sleeper = subprocess.Popen(lab.ssh_command("h01", "sleep 300"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        stop_lab(root, remove=True)
    sleeper.wait(timeout=30)
    assert not any(processes.alive(pid) for pid in pids)
    assert processes.lab_processes(root) == []
    assert not root.exists()


def test_cli_up_status_down(run_gpuops, tmp_path) -> None:
    up = run_gpuops("lab", "up", "--gpu", "h200-x1", "--gpu", "h100-x8", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert "lab up: 2 host(s) in .lab" in up.stdout
    assert "gpuops inspect host -i .lab/inventory.yml" in up.stdout
    status = run_gpuops("lab", "status", "--json", cwd=tmp_path)
    doc = json.loads(status.stdout)
    assert [(h["name"], h["gpu"]) for h in doc["hosts"]] == [("h01", "h200-x1"), ("h02", "h100-x8")]
    assert all(h["sshd_alive"] and h["server_healthy"] for h in doc["hosts"])
    assert doc["inventory"] == str(tmp_path / ".lab" / "inventory.yml")
    # Which speed model each host's stand-in simulates with: printed, and what the server itself reports.
    assert re.search(r"h01 .* single-gpu v\d+ \(assumption\)", up.stdout)
    assert re.search(r"h02 .* nvlink-x8 v\d+ \(assumption\)", up.stdout)
    for host, shape in zip(doc["hosts"], ("single-gpu", "nvlink-x8")):
        assert host["speed_model"]["shape"] == shape
        with urllib.request.urlopen(f"http://127.0.0.1:{host['server_port']}/get_server_info", timeout=10) as reply:
            assert json.loads(reply.read())["speed_model"]["shape"] == shape
    # A second `up` in the same place refuses, naming the directory, and changes nothing.
    again = run_gpuops("lab", "up", cwd=tmp_path)
    assert again.returncode == 2 and "already holds a lab" in again.stderr and "Traceback" not in again.stderr
    pids = [h["server_pid"] for h in doc["hosts"]]
    down = run_gpuops("lab", "down", cwd=tmp_path)
    assert down.returncode == 0 and "stopped 2 host(s)" in down.stdout
    assert not (tmp_path / ".lab").exists()
    assert not any(processes.alive(pid) for pid in pids)
    missing = run_gpuops("lab", "status", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith("gpuops: error: lab: no lab at")


def test_cli_bad_gpu_and_refusing_a_non_lab_dir(run_gpuops, tmp_path) -> None:
    bad = run_gpuops("lab", "up", "--gpu", "b300-x8", "--dir", str(tmp_path / "x"))
    assert bad.returncode == 2 and "b300-x8" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "x").exists()
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep")
    down = run_gpuops("lab", "down", "--dir", str(precious))
    assert down.returncode == 2 and "not a gpuops lab directory" in down.stderr
    assert (precious / "data").read_text() == "keep"


def test_lab_path_with_a_quote_is_refused(tmp_path) -> None:
    with pytest.raises(GpuopsError, match="must not contain quotes"):
        start_lab(tmp_path / 'bad"dir', [LabSpec(server=False)])


def test_missing_openssh_server_is_one_line_with_the_install_command(tmp_path, monkeypatch) -> None:
    from gpuops.lab import sshd

    monkeypatch.setattr(sshd, "SSHD", tmp_path / "no-sshd")
    with pytest.raises(GpuopsError) as err:
        start_lab(tmp_path / "lab", [LabSpec(server=False)])
    assert "apt-get install -y openssh-server" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "lab").exists()


def test_add_hosts_to_a_running_lab(tmp_path) -> None:
    root = tmp_path / "lab"
    with start_lab(root, [LabSpec(gpu="h200-x1", sglang=None, server=False)]) as lab:
        bigger = start_lab(root, [LabSpec(gpu="none", sglang=None, server=False)], add=True)
        assert [h.name for h in bigger.hosts] == ["h01", "h02"]
        known = lab.known_hosts.read_text().splitlines()
        assert len(known) == 2 and all(line.startswith("[127.0.0.1]:") for line in known)
        for host in bigger.hosts:
            done = subprocess.run(lab.ssh_command(host.name, "echo $GPUOPS_LAB_HOST"), capture_output=True, timeout=60)
            assert done.stdout.decode().strip() == host.name


def test_a_server_that_crashes_at_start_fails_the_lab_and_leaves_nothing(tmp_path) -> None:
    root = tmp_path / "lab"
    spec = LabSpec(gpu="rtx-pro-6000-x8", count=2,
                   server_env={"NCCL_ALGO": "Tree", "GPUOPS_STANDIN_CRASH_IF": "NCCL_ALGO=Tree"})
    with pytest.raises(GpuopsError) as err:
        start_lab(root, [spec])
    message = str(err.value)
    assert message.startswith("lab: h0") and "did not start" in message and "\n" not in message
    assert not root.exists()
    assert processes.lab_processes(root) == []


def test_a_failed_add_keeps_the_running_lab(tmp_path) -> None:
    root = tmp_path / "lab"
    with start_lab(root, [LabSpec(gpu="h200-x1", sglang=None, server=True)]) as lab:
        crashing = LabSpec(server_env={"NCCL_ALGO": "Tree", "GPUOPS_STANDIN_CRASH_IF": "NCCL_ALGO=Tree"})
        with pytest.raises(GpuopsError, match="h02: the stand-in server did not start"):
            start_lab(root, [crashing], add=True)
        [status] = lab_status(load_lab(root))
        assert status.name == "h01" and status.sshd_alive and status.server_healthy
        assert not (root / "h02").exists()
        assert len(lab.known_hosts.read_text().splitlines()) == 1


def test_sweep_kills_only_processes_of_that_exact_lab(tmp_path) -> None:
    mine = subprocess.Popen(["sleep", "60"], env={"GPUOPS_LAB_DIR": str(tmp_path / "lab")})
    neighbour = subprocess.Popen(["sleep", "60"], env={"GPUOPS_LAB_DIR": str(tmp_path / "lab2")})
    try:
        assert processes.lab_processes(tmp_path / "lab") == [mine.pid]
        assert processes.sweep(tmp_path / "lab") == [mine.pid]
        mine.wait(timeout=10)  # (already reaped by the sweep's liveness check: no status to assert)
        assert not processes.alive(mine.pid) and neighbour.poll() is None
    finally:
        neighbour.kill()
        neighbour.wait()
