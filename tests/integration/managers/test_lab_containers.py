"""The test infrastructure itself: a booted Debian root with real systemd, and a private dockerd.

These prove the ground the systemd/docker manager tests stand on: systemd is PID 1 of its own
container and answers `running`, the machine's own /tmp and the cached root stay untouched, sshd
answers on the lab's loopback port with the host key of this boot, and teardown by pid leaves no
process or mount behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def ssh(host, *remote: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", str(host.dir / "client_key"), "-p", str(host.booted.ssh_port),
         "-o", f"UserKnownHostsFile={host.dir / 'known_hosts'}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "root@127.0.0.1", *remote],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


def mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as handle:
        return any(line.split()[4] == str(path) for line in handle)


def test_booted_root_runs_systemd_in_its_own_root_and_stops_by_pid(systemd_host_factory, debian_root) -> None:
    # A file in the machine's /tmp: a systemd booted over the machine's root would wipe it.
    marker = Path("/tmp") / f"gpuops-systemd-test-{uuid.uuid4().hex}"
    marker.write_text("still here\n")
    try:
        host = systemd_host_factory(start_server=False)
        done = ssh(host, "systemctl is-system-running; cat /proc/1/comm; test -e /etc/ssh/gpuops_lab_host_ed25519_key && echo own-key")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["running", "systemd", "own-key"]
        # Every write of the boot went to the overlay's upper dir, none to the shared cache.
        assert (host.booted.dir / "upper" / "etc" / "ssh" / "sshd_config.d" / "10-gpuops-lab.conf").is_file()
        assert not (debian_root / "etc" / "ssh" / "sshd_config.d" / "10-gpuops-lab.conf").exists()
        assert not (debian_root / "etc" / "ssh" / "gpuops_lab_host_ed25519_key").exists()
        host.stop()
        assert not os.path.exists(f"/proc/{host.booted.nspawn_pid}")
        assert not os.path.exists(f"/proc/{host.booted.init_pid}")
        assert not mounted(host.booted.merged)
        # Its own cgroups (none shared with another container) are gone with it.
        groups = (host.booted.dir / "cgroups").read_text().split()
        assert groups and all("gpuops-lab-" in g and not os.path.exists(g) for g in groups)
        assert marker.read_text() == "still here\n"
    finally:
        marker.unlink(missing_ok=True)


def test_sglang_unit_serves_the_standin_under_systemd(systemd_host_factory) -> None:
    host = systemd_host_factory(server_args=["--max-running-requests", "7"], server_env={"NCCL_DEBUG": "WARN"})
    show = host.systemctl_show("ActiveState", "MainPID", "FragmentPath", "EnvironmentFiles")
    assert show["ActiveState"] in ("active", "activating")
    assert show["FragmentPath"] == "/etc/systemd/system/sglang.service"
    assert show["EnvironmentFiles"].startswith("/var/lib/gpuops/sglang.env")
    import time

    deadline = time.monotonic() + 60
    info = None
    while info is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{host.server_port}/get_server_info", timeout=5) as r:
                info = json.loads(r.read())
        except OSError:
            time.sleep(0.2)
    assert info is not None, "the stand-in under systemd never answered"
    assert info["max_running_requests"] == 7
    assert info["env"]["NCCL_DEBUG"] == "WARN"
    # The server that answers is the unit's main process (its pid as the container sees it).
    inside = host.booted.run(["cat", "/proc/%s/cmdline" % host.systemctl_show("MainPID")["MainPID"]]).stdout
    assert "sglang.launch_server" in inside


def test_private_dockerd_runs_a_container_from_the_root(docker_daemon, debian_root) -> None:
    from gpuops.lab.dockerd import import_root

    image = import_root(docker_daemon, debian_root, "gpuops-lab/debian:test-infra")
    assert image.startswith("sha256:")
    done = docker_daemon.run("run", "--rm", "--network=host", "gpuops-lab/debian:test-infra",
                             "python3", "-c", "import sys; print(sys.version_info[:2] >= (3, 8))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "True"
