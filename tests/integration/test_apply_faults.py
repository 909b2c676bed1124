"""The fault matrix: whatever dies, whenever, a lab host ends committed or exactly as it was.

Real sshd lab hosts, the real gpuops client in a subprocess, the stand-in server (fusion-sm120's
cells, over the real SGLang 0.5.8 source, are in test_apply_faults_fusion, with these helpers). Faults come from outside gpuops' code path: the lab's fault
file (``STATE/lab-fault.json``, honoured on lab hosts only; see ``gpuops/lab/host_faults.py``, installed as the hosts' ``gpuops_host_hooks``) pauses
the host-side worker at a named phase, then the test kills, with SIGKILL, one of:

  client   the gpuops process (laptop closed, kill -9)
  sshd     the sshd process serving the session (connection cut)
  worker   the host-side worker (OOM killer)
  relay    the session's helper process, then the worker (nothing on the host is left to notice)

After each: the host's files (content and mode) are those from before the run, the server runs the
previous configuration (healthy, its environment without the run's variable), within the lease
(``gpuops_lease=LEASE``), and the next apply works without hand edits.

Labs are shared where a test hands its lab back as it found it (``nccl_lab``: each of its tests
asserts the files and the server it found); a test that leaves its lab changed (a wrapper edited,
a server killed by hand) or needs two hosts starts its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from labtools import progress_records, server_info, tree_hashes

pytestmark = pytest.mark.integration

LEASE = 4  # seconds: short, so that every cell ends quickly
PAUSE_S = 300  # a pause that only a time limit (a lapsed lease, --timeout) ends within a test's time
ROLLED_BACK_WITHIN = LEASE + 60  # + the previous server's restart on a loaded 2-core machine


def fingerprint(root: Path) -> dict[str, tuple[str, int]]:
    """(sha256, mode) of every file the server or the operator cares about (no gpuops bookkeeping)."""
    files = {}
    for rel, entry in tree_hashes(root, skip_runs=True).items():
        kind, mode, *digest = entry.split(" ")
        if kind == "file":
            files[rel] = (digest[0], int(mode, 0))
    return files


def client(lab, role: str, *extra: str, home: Path) -> subprocess.Popen:
    """gpuops in its own process (so that it can be killed), with the test's HOME as run_gpuops has."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "XDG_STATE_HOME")}
    env["HOME"] = str(home)
    return subprocess.Popen(
        [sys.executable, "-m", "gpuops.cli", *([role] if role in ("rollback", "history") else ["apply", role]),
         "-i", str(lab.inventory_path), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def lab_args(role: str, value: int) -> list[str]:
    common = ["-e", f"gpuops_lease={LEASE}", "-e", "gpuops_health_timeout=60", "-e", "gpuops_stop_grace=5"]
    if role == "rollback":
        return []
    return common + ["-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": value}})]


def calls(host) -> set[Path]:
    return set((host.state_dir / "calls").glob("*"))


def paused(host, phase: str, proc: subprocess.Popen | None, earlier: set[Path]) -> dict[str, Any]:
    """Wait until this client's worker pauses at ``phase``; its pids and transaction folder.
    ``proc`` None: the client is gone already (a rollback by the lease pauses)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc is None or proc.poll() is None, proc.communicate()
        for progress in sorted(p / "progress.jsonl" for p in calls(host) - earlier):
            records = progress_records(progress)
            if any(r.get("event") == "paused" and r.get("phase") == phase for r in records):
                worker = next(r for r in records if r.get("event") == "worker")
                return {"dir": progress.parent, "worker": worker["pid"], "relay": worker["relay"]}
        time.sleep(0.05)
    raise AssertionError(f"the worker never paused at {phase}")


def parent_of(pid: int) -> int:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return int(data[data.rindex(b")") + 2:].split()[1])


def kill(what: str, where: dict[str, Any], proc: subprocess.Popen) -> None:
    if what == "client":
        proc.kill()
    elif what == "sshd":
        os.kill(parent_of(where["relay"]), signal.SIGKILL)  # the session's sshd: the connection is cut
    elif what == "worker":
        os.kill(where["worker"], signal.SIGKILL)
    elif what == "relay":
        os.kill(where["relay"], signal.SIGKILL)
        os.kill(where["worker"], signal.SIGKILL)
    else:
        raise ValueError(what)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it ended (and was reaped) between the two looks
        return False


def wait_host_settled(host, where: dict[str, Any]) -> None:
    """The worker is gone and nothing holds the host lock (the run ended one way or the other)."""
    import fcntl

    deadline = time.monotonic() + ROLLED_BACK_WITHIN
    # The session's helper too: when the worker dies, it rolls the run back (holding the lock).
    while alive(where["worker"]) or alive(where["relay"]):
        assert time.monotonic() < deadline, "the worker did not end within the lease"
        time.sleep(0.05)
    fd = os.open(host.state_dir / "lock", os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
            except OSError:
                assert time.monotonic() < deadline, "the host lock stayed held"
                time.sleep(0.05)
    finally:
        os.close(fd)


def journal_events(host, run_id: str | None = None) -> list[tuple[str, str]]:
    lines = (host.state_dir / "journal.jsonl").read_text().splitlines()
    records = [json.loads(l) for l in lines if l.strip()]
    return [(r["run_id"], r["event"]) for r in records if run_id is None or r["run_id"] == run_id]


def server_view(host) -> dict[str, Any]:
    """What the running server says it runs (flags, environment), and that it is alive."""
    info = dict(server_info(host.server_port))
    info.pop("internal_states", None)
    info.pop("random_seed", None)  # drawn anew at every start, as SGLang draws it: not the configuration
    pid = int((host.state_dir / "sglang.pid").read_text())
    assert alive(pid)
    return info


@pytest.fixture(scope="module")
def nccl_lab_started(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang=None)


@pytest.fixture
def nccl_lab(nccl_lab_started):
    """The module's lab host, borrowed: each test asserts it hands it back as it found it. A fault
    file a failed test left unread is removed, so that it cannot pause the next test's run."""
    yield nccl_lab_started
    (nccl_lab_started.hosts[0].state_dir / "lab-fault.json").unlink(missing_ok=True)


NCCL_CELLS = [
    ("client", "first_write"), ("client", "server_start"), ("client", "health"), ("client", "confirm"),
    ("sshd", "after_writes"), ("sshd", "health"),
    ("worker", "first_write"), ("worker", "server_stop"), ("worker", "health"), ("worker", "confirm"),
]


@pytest.mark.parametrize("what, phase", NCCL_CELLS, ids=[f"{w}@{p}" for w, p in NCCL_CELLS])
def test_nccl_env_fault(nccl_lab, what: str, phase: str, run_gpuops, gpuops_home) -> None:
    host = nccl_lab.hosts[0]
    value = 10 + NCCL_CELLS.index((what, phase))
    before, served = fingerprint(host.dir), server_view(host)
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 60}))
    earlier = calls(host)
    proc = client(nccl_lab, "nccl-env", *lab_args("nccl-env", value), home=gpuops_home)
    where = paused(host, phase, proc, earlier)
    kill(what, where, proc)
    out, _ = proc.communicate(timeout=120)
    wait_host_settled(host, where)
    assert fingerprint(host.dir) == before
    assert server_view(host) == served  # the previous server: same flags, same environment
    last = journal_events(host)[-1]
    assert last[1] == "rolled_back", journal_events(host)
    if what == "worker":  # the client was still there: it must say what happened
        assert proc.returncode == 1 and b"worker" in out and b"rolled back" in out.lower(), out
    if what == "sshd":
        assert proc.returncode == 1 and b"unknown" in out, out
    # The next apply works, with no hand edits, and commits.
    again = run_gpuops("apply", "nccl-env", "-i", str(nccl_lab.inventory_path), "--json", *lab_args("nccl-env", value))
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["hosts"]["h01"]["status"] == "finished"
    assert f"NCCL_MIN_NCHANNELS='{value}'" in (host.state_dir / "sglang.env").read_text()


def test_dead_worker_and_session_are_rolled_back_by_the_next_command(nccl_lab, run_gpuops, gpuops_home) -> None:
    """Nothing on the host is left to notice (relay and worker killed): `gpuops history` finishes
    the rollback first, and says so; the home journal learns the host's outcome."""
    host = nccl_lab.hosts[0]
    before, served = fingerprint(host.dir), server_view(host)
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "health", "seconds": 60}))
    earlier = calls(host)
    proc = client(nccl_lab, "nccl-env", *lab_args("nccl-env", 50), home=gpuops_home)
    where = paused(host, "health", proc, earlier)
    kill("relay", where, proc)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and b"unknown: the host will finish or roll back by itself" in out, out
    assert b"changed=" not in out.split(b"RECAP")[1]
    assert fingerprint(host.dir) != before  # half-applied, and no one left on the host to see it
    history = run_gpuops("history", "-i", str(nccl_lab.inventory_path))
    assert history.returncode == 0, history.stdout + history.stderr
    assert "had not finished" in history.stdout and "rolled back first" in history.stdout, history.stdout
    assert fingerprint(host.dir) == before
    assert server_view(host) == served  # the previous server: same flags, same environment
    assert "rolled_back" in history.stdout
    home = [json.loads(l) for l in (gpuops_home / ".local/state/gpuops/journal.jsonl").read_text().splitlines()]
    mine = [r for r in home if r.get("outcome") in ("unknown", "rolled_back") and r.get("host") == "h01"]
    assert [r["outcome"] for r in mine][-2:] == ["unknown", "rolled_back"] and mine[-1].get("reconciled"), mine


def server_pid(host) -> int:
    return int((host.state_dir / "sglang.pid").read_text())


def wait_healthy(host, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{host.server_port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"the server was not healthy within {within} s"
        time.sleep(0.1)


def test_history_leaves_alone_a_previous_server_still_starting(lab_factory, run_gpuops) -> None:
    """Issue 36, defect 7, as seen on a real SGLang 0.5.16: a health timeout (1 s) shorter than the
    server's start (here 8 s: the lab's python wrapper gives every later start of the stand-in
    GPUOPS_STANDIN_STARTUP_S): the apply's rollback restarts the previous server and ends
    rollback_failed while that server still loads; `gpuops history` right after neither kills nor
    restarts it, and says what state it is in. (Before: history killed it, started another, and
    printed "server left as it was".)"""
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None)
    host = lab.hosts[0]
    served = server_view(host)
    wrapper = host.bin_dir / "python-sglang"
    wrapper.write_text(wrapper.read_text().replace(
        "#!/bin/sh\n", "#!/bin/sh\nGPUOPS_STANDIN_STARTUP_S=8; export GPUOPS_STANDIN_STARTUP_S\n", 1))
    before = fingerprint(host.dir)
    applied = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=1",
                         "-e", "gpuops_stop_grace=5", "-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": 52}}))
    assert applied.returncode == 1 and "ROLLBACK FAILED" in applied.stdout, applied.stdout + applied.stderr
    starting = server_pid(host)
    assert f"pid {starting}" in applied.stdout and "left running" in applied.stdout, applied.stdout
    history = run_gpuops("history", "-i", str(lab.inventory_path))
    assert history.returncode == 0, history.stdout + history.stderr
    assert server_pid(host) == starting and alive(starting), "history restarted the server"
    assert "rolled back first" in history.stdout and "left as it was" not in history.stdout, history.stdout
    assert f"pid {starting}" in history.stdout and "worker died" not in history.stdout, history.stdout
    wait_healthy(host, 30)
    assert fingerprint(host.dir) == before
    now = server_view(host)
    assert now["env"].pop("GPUOPS_STANDIN_STARTUP_S") == "8"
    assert now == served  # the previous configuration, started once, by the rollback
    lab.stop(remove=True)


def test_a_previous_server_starting_within_its_deadline_is_waited_for_not_restarted(nccl_lab, run_gpuops,
                                                                                     gpuops_home) -> None:
    """The apply fails at its health check and its rollback starts the previous server; the worker
    and its session die right then (nothing on the host left to wait). The next `gpuops history`
    finds that server alive within its health deadline: it waits for it, and restarts nothing."""
    host = nccl_lab.hosts[0]
    before, served = fingerprint(host.dir), server_view(host)
    (host.state_dir / "lab-fault.json").write_text(
        json.dumps({"fail_at": "health", "pause_at": "rollback_health", "seconds": 60}))
    earlier = calls(host)
    proc = client(nccl_lab, "nccl-env", *lab_args("nccl-env", 53), home=gpuops_home)
    where = paused(host, "rollback_health", proc, earlier)
    started = server_pid(host)
    kill("relay", where, proc)
    proc.communicate(timeout=120)
    history = run_gpuops("history", "-i", str(nccl_lab.inventory_path))
    assert history.returncode == 0, history.stdout + history.stderr
    assert server_pid(host) == started and alive(started), "history restarted the server"
    assert "rolled back first" in history.stdout and f"healthy (pid {started}" in history.stdout, history.stdout
    assert fingerprint(host.dir) == before
    assert server_view(host) == served
    assert journal_events(host)[-1][1] == "rolled_back"


# ---------------------------------------------------------------- rollback is a transaction too


ROLLBACK_CELLS = [("client", "confirm"), ("sshd", "before_write"), ("worker", "rollback_restore")]


@pytest.mark.parametrize("what, phase", ROLLBACK_CELLS, ids=[f"{w}@{p}" for w, p in ROLLBACK_CELLS])
def test_rollback_fault(nccl_lab, what: str, phase: str, run_gpuops, gpuops_home) -> None:
    """The module's lab, handed back as it was found: each cell ends with the run it applied undone
    (asserted: ``pristine`` is the lab as this cell found it)."""
    lab = nccl_lab
    host = lab.hosts[0]
    pristine, served = fingerprint(host.dir), server_view(host)
    value = 60 + ROLLBACK_CELLS.index((what, phase))  # no other run of the module sets it: a real change (<= 64)
    applied = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), *lab_args("nccl-env", value))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    after_apply = fingerprint(host.dir)
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 60}))
    earlier = calls(host)
    proc = client(lab, "rollback", home=gpuops_home)
    where = paused(host, phase, proc, earlier)
    kill(what, where, proc)
    proc.communicate(timeout=120)
    wait_host_settled(host, where)
    # Never half-undone: either the rollback was undone (the run still in effect) or it finished.
    state = fingerprint(host.dir)
    assert state in (after_apply, pristine)
    assert journal_events(host)[-1][1] in ("rolled_back", "finished")
    # And never a dead end: the next rollback undoes the run.
    again = run_gpuops("rollback", "-i", str(lab.inventory_path))
    if state == after_apply:
        assert again.returncode == 0, again.stdout + again.stderr
    assert fingerprint(host.dir) == pristine
    assert server_view(host) == served  # the previous server: same flags, same environment


# ---------------------------------------------------------------- what the host checks and refuses


def test_a_stalled_host_fails_alone_within_timeout_and_rolls_itself_back(lab_factory, run_gpuops, gpuops_home) -> None:
    """h02's SSH session freezes (its sshd stopped) mid-run: gpuops gives h02 up (--timeout, or
    silence for a lease), h01 commits, the command ends; h02 rolls back by itself (lease lapsed)."""
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, count=2)
    stalled = lab.host("h02")
    before, served = fingerprint(stalled.dir), server_view(stalled)
    (stalled.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "health", "seconds": PAUSE_S}))
    earlier = calls(stalled)
    proc = client(lab, "nccl-env", *lab_args("nccl-env", 7), "--timeout", "30", "--json", home=gpuops_home)
    where = paused(stalled, "health", proc, earlier)
    sshd = parent_of(where["relay"])
    os.kill(sshd, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=120)  # a hang fails here; the pause alone lasts PAUSE_S
        wait_host_settled(stalled, where)         # the lease lapsed on the host: rolled back
    finally:
        os.kill(sshd, signal.SIGCONT)
    hosts = json.loads(out)["hosts"]
    assert proc.returncode == 1
    assert hosts["h01"]["status"] == "finished", hosts["h01"]
    assert hosts["h02"]["status"] == "unknown" and "rolls itself back" in hosts["h02"]["error"], hosts["h02"]
    assert fingerprint(stalled.dir) == before
    assert server_view(stalled) == served
    assert journal_events(stalled)[-1][1] == "rolled_back"
    lab.stop(remove=True)


def test_apply_timeout_ends_a_run_whose_connection_stays_healthy(nccl_lab, run_gpuops, gpuops_home) -> None:
    """The worker pauses at the health step for 300 s while its SSH session stays healthy (gpuops'
    heartbeats keep the lease, so only ``--timeout 10`` can end it): gpuops ends within ~30 s naming
    the time limit, and the host, past the same limit, rolls back. (Its only other test, a stalled
    sshd, is ended by the lease first, so it passed with --timeout ignored.) The module's lab: the
    run is rolled back, the lab handed back as it was (asserted)."""
    lab = nccl_lab
    host = lab.hosts[0]
    before, served = fingerprint(host.dir), server_view(host)
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "health", "seconds": PAUSE_S}))
    earlier = calls(host)
    started = time.monotonic()
    proc = client(lab, "nccl-env", *lab_args("nccl-env", 54)[:-2], "-e", "gpuops_lease=30", "-e",
                  json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": 54}}), "--timeout", "10", "--json", home=gpuops_home)
    where = paused(host, "health", proc, earlier)
    # Without --timeout the pause (and the run) lasts PAUSE_S: ending in half of it can only be the
    # time limit, however loaded the machine (a fixed 40 s failed a loaded 4-worker run).
    out, err = proc.communicate(timeout=PAUSE_S / 2)
    took = time.monotonic() - started
    report = json.loads(out)["hosts"][host.name]
    assert took < PAUSE_S / 2, f"apply --timeout 10 took {took:.0f} s"
    assert proc.returncode == 1 and report["status"] == "unknown", report
    assert "--timeout" in report["error"], report["error"]
    wait_host_settled(host, where)
    assert journal_events(host)[-1][1] == "rolled_back"
    assert fingerprint(host.dir) == before and server_view(host) == served


def test_a_port_held_by_another_process_fails_the_run_naming_it(lab_factory, run_gpuops) -> None:
    """The pid file is gone but the old server still listens: the new server cannot bind, and the
    answer on the port must not pass for it. The run fails naming the holder and rolls back."""
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None)
    host = lab.hosts[0]
    old_pid = int((host.state_dir / "sglang.pid").read_text())
    (host.state_dir / "sglang.pid").unlink()
    before = fingerprint(host.dir)
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--json", *lab_args("nccl-env", 9))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["h01"]
    assert report["status"] == "rolled_back", report
    assert f"port {host.server_port}" in report["error"] and f"pid {old_pid}" in report["error"], report["error"]
    assert fingerprint(host.dir) == before
    assert alive(old_pid) and '"NCCL_MIN_NCHANNELS": "9"' not in json.dumps(server_info(host.server_port))
    os.kill(old_pid, signal.SIGTERM)
    lab.stop(remove=True)


def test_rollback_over_ssh_refuses_a_later_hand_edit_unless_forced(nccl_lab, run_gpuops) -> None:
    """The module's lab: the forced rollback hands it back as it was found (asserted)."""
    lab = nccl_lab
    host = lab.hosts[0]
    pristine = fingerprint(host.dir)
    laters = set((host.state_dir / "runs").glob("*/files/*.later"))
    assert run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), *lab_args("nccl-env", 55)).returncode == 0
    env_file = host.state_dir / "sglang.env"
    env_file.write_text(env_file.read_text() + "OPERATOR_NOTE='by hand'\n")
    refused = run_gpuops("rollback", "-i", str(lab.inventory_path))
    assert refused.returncode == 1 and str(env_file) in refused.stdout and "--force" in refused.stdout, refused.stdout
    assert "by hand" in env_file.read_text()
    forced = run_gpuops("rollback", "-i", str(lab.inventory_path), "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "--force: the later version of" in forced.stdout
    assert fingerprint(host.dir) == pristine
    assert set((host.state_dir / "runs").glob("*/files/*.later")) - laters  # the hand edit kept, beside the run


def test_inspect_rolls_back_a_dead_run_before_it_reports(nccl_lab, run_gpuops, gpuops_home) -> None:
    host = nccl_lab.hosts[0]
    before, served = fingerprint(host.dir), server_view(host)
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "server_start", "seconds": 60}))
    earlier = calls(host)
    proc = client(nccl_lab, "nccl-env", *lab_args("nccl-env", 51), home=gpuops_home)
    where = paused(host, "server_start", proc, earlier)
    kill("relay", where, proc)  # the server is stopped, the env file changed, nobody left on the host
    proc.communicate(timeout=120)
    inspect = run_gpuops("inspect", "host", "-i", str(nccl_lab.inventory_path), "--json")
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    report = json.loads(inspect.stdout)["hosts"]["h01"]
    assert any("rolled back first" in line for line in report["recovered"]), report["recovered"]
    assert fingerprint(host.dir) == before
    assert server_view(host) == served


def test_a_server_not_running_what_its_launch_script_sets_fails_the_run(lab_factory, run_gpuops) -> None:
    """Health and the port are not enough: the server gpuops started must run with the environment
    its launch script gives (here a wrapper on the host overrides a variable the run sets)."""
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None)
    host = lab.hosts[0]
    wrapper = host.bin_dir / "python-sglang"
    wrapper.write_text(wrapper.read_text().replace("#!/bin/sh\n", "#!/bin/sh\nNCCL_MIN_NCHANNELS=1; export NCCL_MIN_NCHANNELS\n", 1))
    before = fingerprint(host.dir)
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--json", *lab_args("nccl-env", 8))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["h01"]
    assert report["status"] == "rolled_back", report
    assert "NCCL_MIN_NCHANNELS is different" in report["error"] and "'8'" not in report["error"], report["error"]
    assert fingerprint(host.dir) == before
    lab.stop(remove=True)
