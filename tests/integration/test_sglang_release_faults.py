"""sglang-release under faults: whatever dies during the switch, the host is back on the old release.

The release environment is built once (a staged run), so each cell is only the switch. The lab's
fault file pauses the host-side worker at a phase, then the test kills the client (kill -9) or the
worker (OOM killer) there: the launch files come back byte for byte and the server that answers is
the old environment's, 0.5.8; the new environment stays for the next try, which switches.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpuops.lab.hosts import LabSpec
from gpuops.lab.wheelhouse import build_wheelhouse
from labtools import server_info
from test_apply_faults import calls, client, fingerprint, journal_events, kill, paused, wait_host_settled

pytestmark = pytest.mark.integration

CELLS = [("client", "server_stop"), ("client", "health"), ("worker", "server_start"), ("worker", "confirm")]


@pytest.fixture(scope="module")
def staged(lab_factory, tmp_path_factory: pytest.TempPathFactory):
    import os
    import subprocess
    import sys

    lab = lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("rel",)))
    base = tmp_path_factory.mktemp("release")
    wheelhouse = build_wheelhouse(base / "wheelhouse", ["0.5.21"])
    args = ["-e", f"gpuops_envs_dir={base / 'envs'}", "-e", f"sglang_wheelhouse={wheelhouse}", "-e", "sglang_version=0.5.21",
            "-e", "gpuops_lease=10", "-e", "smoke_check=false"]  # a lease a loaded machine renews
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "GPUOPS_LAB_DIR")}
    env["HOME"] = str(base / "home")
    done = subprocess.run([sys.executable, "-m", "gpuops.cli", "apply", "sglang-release", "-i", str(lab.inventory_path),
                           *args, "-e", "sglang_release_stage=true", "--json"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert done.returncode == 0 and json.loads(done.stdout)["hosts"]["rel"]["status"] == "staged", done.stdout + done.stderr
    return lab, args, base / "envs"


@pytest.mark.timeout(900)  # the module's environment build comes first, on a shared machine
@pytest.mark.parametrize("what, phase", CELLS, ids=[f"{w}@{p}" for w, p in CELLS])
def test_release_switch_fault(staged, what: str, phase: str, gpuops_home: Path) -> None:
    lab, args, envs = staged
    host = lab.hosts[0]
    before = fingerprint(host.dir)
    assert server_info(host.server_port)["version"] == "0.5.8"
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 60}))
    earlier = calls(host)
    proc = client(lab, "sglang-release", *args, home=gpuops_home)
    where = paused(host, phase, proc, earlier)
    kill(what, where, proc)
    out, _ = proc.communicate(timeout=120)
    wait_host_settled(host, where)
    assert fingerprint(host.dir) == before
    assert server_info(host.server_port)["version"] == "0.5.8"  # the old environment serves again
    assert journal_events(host)[-1][1] == "rolled_back", journal_events(host)
    if what == "worker":
        assert proc.returncode == 1 and b"rolled back" in out.lower(), out
    assert len(list(envs.glob("sglang-0.5.21-*"))) == 1  # kept, finished, for the next try
