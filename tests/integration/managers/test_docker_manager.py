"""sglang_manager: docker, against a real docker daemon (private, host network, local images).

One lab host for the module whose `docker` reaches the test's daemon; its SGLang runs in a
container made from the Debian root plus the stand-in server. Every test leaves the host as it
found it. What runs is read from docker itself (`docker inspect`), never from gpuops' files.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from typing import Any

import pytest
from labtools import server_info, wait_for_self_rollback, wait_server_info

pytestmark = pytest.mark.integration

ORIGINAL_ENV = {"GPUOPS_STANDIN_CRASH_IF": "NCCL_MIN_NCHANNELS=13", "NCCL_DEBUG": "WARN"}


@pytest.fixture(scope="module")
def docker_host(lab_factory, docker_daemon, debian_root):
    from gpuops.lab.docker_host import setup_docker_host, standin_image

    image = standin_image(docker_daemon, debian_root)
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, server=False)
    dh = setup_docker_host(lab, docker_daemon, image, server_env=ORIGINAL_ENV)
    yield dh
    docker_daemon.run("rm", "-f", dh.container, timeout=120)  # the daemon is the session's


def apply(run_gpuops, dh, *args: str) -> subprocess.CompletedProcess:
    return run_gpuops("apply", *args, "-i", str(dh.lab.inventory_path), "--json", "-e", "gpuops_health_timeout=30",
                      env={"XDG_STATE_HOME": ""})


def report_of(proc: subprocess.CompletedProcess, name: str) -> dict[str, Any]:
    try:
        return json.loads(proc.stdout)["hosts"][name]
    except (ValueError, KeyError):
        raise AssertionError(f"no JSON report: {proc.stdout}\n{proc.stderr}") from None


def files(dh) -> dict[str, str]:
    state = dh.host.state_dir
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (state / "sglang.docker.env", state / "sglang-docker-run.sh")}


def served(dh, timeout: float = 30) -> dict[str, Any]:
    return wait_server_info(dh.server_port, timeout)


def spec(info: dict[str, Any]) -> tuple[Any, ...]:
    """What a recreate must reproduce: image, command, environment, network."""
    return (info["Config"]["Image"], info["Image"], tuple(info["Config"]["Cmd"] or ()),
            tuple(sorted(e for e in info["Config"]["Env"] if not e.startswith("PATH="))),
            info["HostConfig"]["NetworkMode"])


def test_env_change_recreates_the_container_then_rerun_and_rollback(docker_host, run_gpuops) -> None:
    dh = docker_host
    name = dh.host.name
    before_files, before = files(dh), dh.inspect()
    served(dh)
    extra = json.dumps({"sglang_env": {**ORIGINAL_ENV, "SGLANG_NOTE": "it's \\ a $HOME `id`"}})
    proc = apply(run_gpuops, dh, "sglang-service", "-e", extra)
    report = report_of(proc, name)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    assert [c["path"].rsplit("/", 1)[1] for c in report["changes"]] == ["sglang.docker.env"]
    after = dh.inspect()
    assert after["Id"] != before["Id"] and after["State"]["Running"]
    assert "SGLANG_NOTE=it's \\ a $HOME `id`" in after["Config"]["Env"]
    assert served(dh)["env"]["SGLANG_NOTE"] == "it's \\ a $HOME `id`"
    assert report["pid"] == after["State"]["Pid"]

    again = apply(run_gpuops, dh, "sglang-service", "-e", extra)
    second = report_of(again, name)
    assert again.returncode == 0 and second["changed"] == 0 and second["status"] == "unchanged"
    assert dh.inspect()["Id"] == after["Id"]  # not recreated

    back = run_gpuops("rollback", "-i", str(dh.lab.inventory_path), env={"XDG_STATE_HOME": ""})
    assert back.returncode == 0, back.stdout + back.stderr
    assert files(dh) == before_files
    restored = dh.inspect()
    assert restored["Id"] not in (before["Id"], after["Id"]) and restored["State"]["Running"]
    assert spec(restored) == spec(before)
    assert "SGLANG_NOTE" not in served(dh)["env"]


def test_a_container_whose_server_crashes_is_a_failed_start_and_rolls_back(docker_host, run_gpuops) -> None:
    dh = docker_host
    before_files, before = files(dh), dh.inspect()
    proc = apply(run_gpuops, dh, "nccl-env", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 13}}')
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
    assert "exit code 1" in report["error"]
    assert "NCCL_MIN_NCHANNELS=13 is not supported" in (report.get("log_tail") or "")
    assert files(dh) == before_files
    restored = dh.inspect()
    assert restored["State"]["Running"] and spec(restored) == spec(before)
    info = served(dh)
    assert "NCCL_MIN_NCHANNELS" not in info["env"] and info["env"]["NCCL_DEBUG"] == "WARN"


def test_inspect_sees_the_containerised_server(docker_host, run_gpuops) -> None:
    dh = docker_host
    served(dh)
    proc = run_gpuops("inspect", "host", "-i", str(dh.lab.inventory_path), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    server = json.loads(proc.stdout)["hosts"][dh.host.name]["facts"]["server"]
    info = dh.inspect()
    assert server["running"] and server["manager"] == "docker"
    assert server["unit"] == info["Id"][:12]
    assert server["env"]["NCCL_DEBUG"] == "WARN"
    box = server["docker"]
    assert box["id"] == info["Id"] and box["name"] == "sglang" and box["status"] == "running"
    assert box["image"] == info["Config"]["Image"] == dh.image and box["image_id"] == info["Image"]
    assert box["cmd"] == info["Config"]["Cmd"] and box["cmd"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert box["restart_count"] == info["RestartCount"] and box["network_mode"] == "host"
    # Only the server-relevant names leave the host (the image's PATH does not).
    assert box["env"] == {"NCCL_DEBUG": "WARN"}
    text = run_gpuops("inspect", "host", "-v", "-i", str(dh.lab.inventory_path)).stdout
    assert f"docker: container sglang ({info['Id'][:12]}) running, image {dh.image}" in text


def test_fusion_on_a_container_without_sglang_fails_naming_the_container_and_changes_nothing(docker_host, run_gpuops) -> None:
    # The audit runs in the container (tests/integration/managers/test_docker_fusion.py patches a
    # real SGLang there); this image has none, so there is nothing to patch: the host's own python
    # is never audited in its place, and nothing on the host is touched.
    dh = docker_host
    before_files, before = files(dh), dh.inspect()
    proc = run_gpuops("apply", "fusion-sm120", "-i", str(dh.lab.inventory_path), env={"XDG_STATE_HOME": ""})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "sglang is not installed" in proc.stdout and "in container sglang" in proc.stdout, proc.stdout
    assert files(dh) == before_files and dh.inspect()["Id"] == before["Id"]
    assert not (dh.host.state_dir / "journal.jsonl").exists() or "fusion" not in (dh.host.state_dir / "journal.jsonl").read_text()
    assert not dh.daemon.run("images", "-q", "--filter", "reference=gpuops/*").stdout.strip()


def test_a_new_image_and_port_roll_back_to_the_original_image_and_port(docker_host, run_gpuops, tmp_path) -> None:
    from gpuops.lab.sshd import free_port

    dh = docker_host
    # Another image: the same server, a different image id (as an upgrade would be).
    (tmp_path / "Dockerfile").write_text(f"FROM {dh.image}\nLABEL gpuops.test=upgrade\n")
    built = subprocess.run(dh.daemon.cli("build", "-q", "-t", "gpuops-lab/sglang-standin:upgrade", str(tmp_path)),
                           capture_output=True, text=True, env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"})
    assert built.returncode == 0, built.stderr
    before_files, before = files(dh), dh.inspect()
    new_port = free_port()
    proc = apply(run_gpuops, dh, "sglang-service", "-e", "sglang_docker_image=gpuops-lab/sglang-standin:upgrade",
                 "-e", f"sglang_port={new_port}")
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    upgraded = dh.inspect()
    assert upgraded["Config"]["Image"] == "gpuops-lab/sglang-standin:upgrade" and upgraded["Image"] != before["Image"]
    assert server_info(new_port)["port"] == new_port

    back = run_gpuops("rollback", "-i", str(dh.lab.inventory_path), env={"XDG_STATE_HOME": ""})
    assert back.returncode == 0, back.stdout + back.stderr
    assert files(dh) == before_files
    restored = dh.inspect()
    assert restored["Image"] == before["Image"] and spec(restored) == spec(before)
    assert served(dh)["port"] == dh.server_port


def test_a_container_docker_keeps_restarting_is_a_failed_start(docker_host, run_gpuops) -> None:
    # --restart on-failure: docker brings the crashed server back by itself; that is a failed
    # start too, not a server that happens to be up when gpuops looks.
    dh = docker_host
    before_files, before = files(dh), dh.inspect()
    options = json.dumps({"sglang_docker_options": ["--network=host", "--restart=on-failure:100"],
                          "nccl_env": {"NCCL_MIN_NCHANNELS": 13}})
    proc = apply(run_gpuops, dh, "nccl-env", "-e", options)
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
    assert "docker restarted the container" in report["error"] or "exit code 1" in report["error"]
    assert files(dh) == before_files
    restored = dh.inspect()
    assert restored["State"]["Running"] and spec(restored) == spec(before)
    assert restored["HostConfig"]["RestartPolicy"]["Name"] in ("", "no")
    assert "NCCL_MIN_NCHANNELS" not in served(dh)["env"]


def test_client_killed_during_the_health_wait_the_container_spec_comes_back(docker_host, gpuops_home) -> None:
    import signal

    from labtools import client_paused_at, rolled_back_count

    dh = docker_host
    state = dh.host.state_dir
    before_files, before = files(dh), dh.inspect()
    rolled_before = rolled_back_count(state)
    client = client_paused_at(state, "health", ["apply", "nccl-env", "-i", str(dh.lab.inventory_path), "-e", "gpuops_lease=4",
                                                "-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": 8}})], gpuops_home, 120)
    try:
        assert dh.inspect()["Id"] != before["Id"]  # recreated with the new environment
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    deadline = time.monotonic() + 4 + 60
    wait_for_self_rollback(state / "lock", lambda: rolled_back_count(state) > rolled_before, deadline)
    assert files(dh) == before_files
    restored = dh.inspect()
    assert restored["State"]["Running"] and spec(restored) == spec(before)
    assert "NCCL_MIN_NCHANNELS" not in served(dh)["env"]
