"""sglang-release under faults: whatever dies during the switch, the host is back on the old release.

The release environment is built once (a staged run), so each cell is only the switch. The lab's
fault file pauses the host-side worker at a phase, then the test kills the client (kill -9) or the
worker (OOM killer) there: the launch files come back byte for byte and the server that answers is
the old environment's, 0.5.8; the new environment stays for the next try, which switches. The
lease cell stops the client (SIGSTOP: its connection stays up, its heartbeats stop) while the worker
is paused: the lease lapses on the host, which rolls back by itself. And a build that fails on its
way (its pip killed) refuses the switch and leaves nothing of itself. The staged build runs with
uv on the host's PATH, the killed one without (venv + pip).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpuops.lab.hosts import LabSpec
from gpuops.lab.wheelhouse import build_wheelhouse
from labtools import server_info
from test_apply_faults import calls, client, fingerprint, journal_events, kill, paused, wait_host_settled

pytestmark = pytest.mark.integration

# Each state the switch passes through: a launch file half written (first_write), all written with
# the old server still up (server_stop), no server (server_start), the new one up (health), the
# commit pending (confirm).
CELLS = [("worker", "first_write"), ("client", "server_stop"), ("client", "health"), ("worker", "server_start"),
         ("worker", "confirm"), ("lease", "server_start")]


@pytest.fixture(scope="module")
def staged(lab_factory, tmp_path_factory: pytest.TempPathFactory):
    lab = lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("rel",)))
    # The host has uv (the test extra's): the staged build takes seconds, not a pip resolve's minute.
    (lab.hosts[0].bin_dir / "uv").symlink_to(Path(sys.executable).with_name("uv"))
    base = tmp_path_factory.mktemp("release")
    wheelhouse = build_wheelhouse(base / "wheelhouse", ["0.5.21"])
    args = ["-e", f"gpuops_envs_dir={base / 'envs'}", "-e", f"sglang_wheelhouse={wheelhouse}", "-e", "sglang_version=0.5.21",
            "-e", "gpuops_lease=10", "-e", "smoke_check=false"]  # a lease a loaded machine renews
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "GPUOPS_LAB_DIR")}
    env["HOME"] = str(base / "home")
    env["GPUOPS_KEEP"] = str(base / "kept")
    done = subprocess.run([sys.executable, "-m", "gpuops.cli", "apply", "sglang-release", "-i", str(lab.inventory_path),
                           *args, "-e", "sglang_release_stage=true", "--json"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert done.returncode == 0 and json.loads(done.stdout)["hosts"]["rel"]["status"] == "staged", done.stdout + done.stderr
    return lab, args, base / "envs", base / "kept"


@pytest.mark.timeout(900)  # the module's environment build comes first, on a shared machine
@pytest.mark.parametrize("what, phase", CELLS, ids=[f"{w}@{p}" for w, p in CELLS])
def test_release_switch_fault(staged, what: str, phase: str, gpuops_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab, args, envs, kept = staged
    # What gpuops keeps (memo.py: bundled helper scripts, catalog values, the planner's discovery) is
    # the staging run's, as it is for an operator who staged and then switches from the same machine,
    # instead of each cell's client computing it all again from an empty cache.
    monkeypatch.setenv("GPUOPS_KEEP", str(kept))
    host = lab.hosts[0]
    before = fingerprint(host.dir)
    assert server_info(host.server_port)["version"] == "0.5.8"
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 60}))
    earlier = calls(host)
    proc = client(lab, "sglang-release", *args, home=gpuops_home)
    where = paused(host, phase, proc, earlier)
    if what == "lease":  # the client freezes mid-switch: no heartbeat reaches the host for a lease
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_host_settled(host, where)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    else:
        kill(what, where, proc)
    out, _ = proc.communicate(timeout=120)
    wait_host_settled(host, where)
    assert fingerprint(host.dir) == before
    assert server_info(host.server_port)["version"] == "0.5.8"  # the old environment serves again
    assert journal_events(host)[-1][1] == "rolled_back", journal_events(host)
    if what == "worker":
        assert proc.returncode == 1 and b"rolled back" in out.lower(), out
    assert len(list(envs.glob("sglang-0.5.21-*"))) == 1  # kept, finished, for the next try


def _pip_of(envs: Path) -> int | None:
    """The pid of a pip that installs into an environment under ``envs``, if one runs."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].startswith(str(envs).encode()) and b"pip" in argv and b"install" in argv:
            return int(proc.name)
    return None


@pytest.mark.timeout(600)
def test_a_build_whose_pip_is_killed_refuses_and_leaves_nothing(staged, gpuops_home: Path, tmp_path: Path) -> None:
    lab, args, _, _ = staged
    host = lab.hosts[0]
    (host.bin_dir / "uv").unlink()  # this build is venv + pip: the pip to kill
    envs = tmp_path / "envs"  # another environment directory: a build from scratch
    args = [f"gpuops_envs_dir={envs}" if a.startswith("gpuops_envs_dir=") else a for a in args]
    before = fingerprint(host.dir)
    proc = client(lab, "sglang-release", *args, "--json", home=gpuops_home)
    deadline = time.monotonic() + 300
    while (pip := _pip_of(envs)) is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(pip, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    report = json.loads(out)["hosts"]["rel"]
    assert report["status"] == "refused" and "exited -9" in report["error"], report
    assert "refused before the server stopped, nothing was changed" in report["error"]
    assert not list(envs.glob("sglang-*")), "the killed build left its environment"
    assert fingerprint(host.dir) == before
    assert server_info(host.server_port)["version"] == "0.5.8"
