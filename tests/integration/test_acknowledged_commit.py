"""A slow or frozen client, or one interrupted, never tells the operator anything but what the host did.

Two labs, both kept for the module:

* ``host`` (one lab host, lease 4 s): the matrix. At each phase of a run (prepare, restart, health,
  the client's own smoke check, confirm, commit, and the host's rollback) the client is frozen
  (SIGSTOP) past the lease, or interrupted (SIGINT); what it then reports (its JSON status and exit
  status, or the lines Ctrl-C prints) must be what the host journaled. The test acts once the client
  has *said* it reached the phase (``-v`` logs each phase once the client knows it), never after a
  fixed sleep.
* ``slow_hosts`` (three lab hosts whose restarted server gives its first answer after 10, 40 and
  120 s, a real server compiling kernels on first use): one ``apply`` with the DEFAULT limits (lease
  30 s, smoke 600 s) must commit on all three and say so, exit 0. It runs in the background from the
  module's first test on and is judged by the last, so its ~2.5 minutes of waiting overlap the
  matrix instead of adding to the suite.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from labtools import WatchedClient, tree_hashes

pytestmark = pytest.mark.integration

LEASE = 4
FIRST_ANSWER_S = 6  # the matrix host's first answer after each start (only the smoke check asks it)
SLOW = {"h10": 10, "h40": 40, "h120": 120}  # first answer after a start, seconds


def _change(value: int, *extra: str) -> list[str]:
    return ["-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": str(value)}}), "-e", f"gpuops_lease={LEASE}",
            "-e", "gpuops_stop_grace=5", "-e", "gpuops_health_timeout=60", *extra]


def _records(host) -> list[dict[str, Any]]:
    path = host.state_dir / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _events(host, run_id: str) -> list[str]:
    return [r["event"] for r in _records(host) if r.get("run_id") == run_id]


def _last_started(host) -> str:
    return [r["run_id"] for r in _records(host) if r["event"] == "started"][-1]


def _progress(host, calls_before: set[Path]) -> str:
    return "".join((c / "progress.jsonl").read_text() for c in set((host.state_dir / "calls").glob("*")) - calls_before
                   if (c / "progress.jsonl").exists())


def _poll(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _settled(host, run_id: str) -> None:
    """The host ended ``run_id`` (journaled finished or rolled_back) and let go of its lock."""
    _poll(lambda: bool(set(_events(host, run_id)) & {"finished", "rolled_back"}), f"the host never ended {run_id}")
    fd = os.open(host.state_dir / "lock", os.O_RDWR)
    try:
        def free() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
        _poll(free, "the host lock stayed held")
    finally:
        os.close(fd)


def _first_answer_asked(port: int) -> "socket.socket":
    """A generation request sent and left open: the server is inside its first answer's wait."""
    body = b'{"text": "x", "sampling_params": {"max_new_tokens": 1}}'
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


# ---------------------------------------------------------------- slow first answers, default limits


@pytest.fixture(scope="module")
def slow_hosts(lab_factory, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """Started once, in the background: the apply over the three slow hosts, with no limit given."""
    from gpuops.lab.hosts import LabSpec

    lab = lab_factory(*(LabSpec(names=(name,), sglang=None, server_env={"GPUOPS_STANDIN_FIRST_ANSWER_S": str(s)})
                        for name, s in SLOW.items()))
    home = tmp_path_factory.mktemp("slow-home")
    (home / ".ssh").mkdir(mode=0o700)
    # The running servers' own slow first answer is taken by a request left waiting (its answer is
    # never read): the smoke check's "before" prompts, seconds later, are answered at once, so the
    # run waits only on the restarted server's first answer. (Were they not, the run would only
    # take longer: the servers answer, and the assertions hold.)
    waiting = [_first_answer_asked(h.server_port) for h in lab.hosts]
    started = time.monotonic()
    client = WatchedClient(["apply", "nccl-env", "-i", str(lab.inventory_path), "--json", "-e", "smoke_check=true",
                            "-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": "3"}})], home)
    yield {"lab": lab, "client": client, "started": started}
    client.kill()
    for sock in waiting:
        sock.close()


@pytest.fixture(scope="module")
def host(lab_factory, slow_hosts):  # slow_hosts: its apply runs while the matrix does
    from gpuops.lab.hosts import LabSpec

    lab = lab_factory(LabSpec(names=("h01",), sglang=None,
                              server_env={"GPUOPS_STANDIN_FIRST_ANSWER_S": str(FIRST_ANSWER_S)}))
    return lab.hosts[0], lab.inventory_path


# ---------------------------------------------------------------- the matrix

# phase: where the host's worker pauses (lab-fault.json), or "verified" (the client's own smoke check
# while the restarted server takes FIRST_ANSWER_S to answer); outcome: what the host must journal.
PHASES = {
    "prepare": ("after_writes", "rolled_back"),
    "restart": ("server_start", "rolled_back"),
    "health": ("health", "rolled_back"),
    "smoke": ("verified", "rolled_back"),
    "confirm": ("confirm", "rolled_back"),
    "commit": ("committed", "finished"),
}


class Cell:
    """One run of the matrix: the client started with the fault set, and held at its phase."""

    def __init__(self, host, inventory: Path, home: Path, step: str, value: int, fault: dict[str, Any]) -> None:
        self.host, self.step = host, step
        self.phase, self.outcome = PHASES.get(step, ("health", "rolled_back"))
        self.before = tree_hashes(host.dir, skip_runs=True)
        self.calls = set((host.state_dir / "calls").glob("*"))
        if fault:
            (host.state_dir / "lab-fault.json").write_text(json.dumps(fault))
        smoke = ["-e", "smoke_check=true"] if self.phase == "verified" else []
        # The running server's slow first answer is taken by a request left waiting (never read; it
        # ends with that server, which the run restarts): the check's "before" prompts are answered
        # at once, and the cell does not wait FIRST_ANSWER_S for an answer no assertion reads.
        self.waiting = _first_answer_asked(host.server_port) if smoke else None
        self.client = WatchedClient(["apply", "nccl-env", "-i", str(inventory), "--json", "-v",
                                     *_change(value, *smoke)], home)

    def reach(self) -> str:
        """Wait until the host is at the phase and the client knows it; the run id."""
        if self.phase == "verified":
            self.client.wait_for("verified on the host; gpuops checks it before the commit")
        else:
            _poll(lambda: '"paused"' in (text := _progress(self.host, self.calls)) and f'"phase": "{self.phase}"' in text,
                  f"the worker never paused at {self.phase}")
            self.client.wait_for(": commit sent" if self.phase == "committed" else f" at {self.phase}\n")
        return _last_started(self.host)

    def host_as_it_was(self) -> bool:
        return tree_hashes(self.host.dir, skip_runs=True) == self.before

    def close(self) -> None:
        self.client.kill()
        if self.waiting is not None:
            self.waiting.close()
        (self.host.state_dir / "lab-fault.json").unlink(missing_ok=True)
        (self.host.state_dir / RELEASE).unlink(missing_ok=True)


def _fault(phase: str) -> dict[str, Any]:
    return {} if phase == "verified" else {"pause_at": phase, "seconds": 60}


@pytest.mark.parametrize("step", list(PHASES))
def test_a_client_frozen_past_the_lease_reports_what_the_host_did(host, gpuops_home, step: str) -> None:
    """SIGSTOP (the heartbeat thread stops too) until the host has acted on the lapsed lease (rolled
    back; at the commit step it had already committed), then SIGCONT: the client's status, exit
    status and words are the host's journal, never a guess."""
    lab_host, inventory = host
    cell = Cell(lab_host, inventory, gpuops_home, step, 20 + list(PHASES).index(step), _fault(PHASES[step][0]))
    try:
        run_id = cell.reach()
        cell.client.proc.send_signal(signal.SIGSTOP)
        try:
            if cell.outcome == "finished":  # the pause at "committed" ends only once the lease lapsed
                _poll(lambda: '"event": "committed"' in _progress(lab_host, cell.calls),
                      "the host never answered the commit")
            else:
                _poll(lambda: "rolled_back" in _events(lab_host, run_id), "the host never rolled back")
        finally:
            cell.client.proc.send_signal(signal.SIGCONT)
        out, err, status = cell.client.finish()
        report = json.loads(out)["hosts"]["h01"]
        _settled(lab_host, run_id)
        journaled = [e for e in _events(lab_host, run_id) if e in ("finished", "rolled_back")]
        assert journaled == [cell.outcome], _events(lab_host, run_id)
        assert report["run_id"] == run_id and report["status"] == cell.outcome, (report, err[-2000:])
        assert status == (0 if cell.outcome == "finished" else 1), (report, err[-2000:])
        assert "most likely" not in out + err
        if cell.outcome == "rolled_back":
            assert cell.host_as_it_was()
    finally:
        cell.close()


CTRL_C = [*PHASES, "rollback"]
RELEASE = "lab-fault.release"  # the file that ends the "rollback" cell's pause (host_faults' "until")


@pytest.mark.parametrize("step", CTRL_C)
def test_ctrl_c_says_what_the_host_does_and_the_journal_agrees(host, gpuops_home, step: str) -> None:
    """SIGINT once the client knows the phase: per host, the run, where it was, what the host does
    now (roll back, or finish the commit gpuops sent) and the command to check; exit 130; and the
    host does exactly that. ``rollback``: the run failed at health and the host is restoring it."""
    lab_host, inventory = host
    # At rollback_restore the host waits (no lease ends that pause) until the test releases it, once
    # the client has said its words: before, a fixed 10 s pause, most of this cell's time.
    fault = {"fail_at": "health", "pause_at": "rollback_restore", "seconds": 60, "until": RELEASE} \
        if step == "rollback" else _fault(PHASES[step][0])
    cell = Cell(lab_host, inventory, gpuops_home, step, 40 + CTRL_C.index(step), fault)
    try:
        if step == "rollback":
            _poll(lambda: '"rollback_restore"' in _progress(lab_host, cell.calls), "the host never began its rollback")
            cell.client.wait_for(" at health\n")
            run_id = _last_started(lab_host)
        else:
            run_id = cell.reach()
        cell.client.proc.send_signal(signal.SIGINT)
        _, err, status = cell.client.finish(timeout=60)
        (lab_host.state_dir / RELEASE).touch()  # the rollback's pause ends (made before it, it never began)
        _settled(lab_host, run_id)
        (lab_host.state_dir / RELEASE).unlink(missing_ok=True)  # the test's file, not the host's state
        journaled = [e for e in _events(lab_host, run_id) if e in ("finished", "rolled_back")]
        assert journaled == [cell.outcome], _events(lab_host, run_id)
        assert status == 130, err[-2000:]
        said = {"verified": "verified", "committed": "verified"}.get(cell.phase, cell.phase)
        assert f"gpuops: h01: run {run_id} was at {said};" in err, err[-2000:]
        if cell.outcome == "finished":
            assert "gpuops had confirmed it, so the host finishes the commit" in err, err[-2000:]
        else:
            assert "gpuops had not confirmed it, so the host rolls it back now" in err, err[-2000:]
            assert cell.host_as_it_was()
        assert "check: gpuops history -l h01" in err
    finally:
        cell.close()


def test_ctrl_c_during_gpuops_rollback_undoes_the_rollback_and_says_so(host, gpuops_home, run_gpuops) -> None:
    """Ctrl-C while ``gpuops rollback`` is at its first write: the line says the host undoes this
    rollback and the run it was undoing stays in effect; the journal and the files agree."""
    lab_host, inventory = host
    applied = run_gpuops("apply", "nccl-env", "-i", str(inventory), "--json", *_change(33))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    in_effect = tree_hashes(lab_host.dir, skip_runs=True)
    calls = set((lab_host.state_dir / "calls").glob("*"))
    (lab_host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "before_write", "seconds": 60}))
    client = WatchedClient(["rollback", "-i", str(inventory), "-v"], gpuops_home)
    try:
        _poll(lambda: '"paused"' in (text := _progress(lab_host, calls)) and '"phase": "before_write"' in text,
              "the rollback never paused at before_write")
        client.wait_for(" at before_write\n")
        run_id = _last_started(lab_host)
        client.proc.send_signal(signal.SIGINT)
        _, err, status = client.finish(timeout=60)
        _settled(lab_host, run_id)
        assert status == 130, err[-2000:]
        assert f"gpuops: h01: run {run_id} was at before_write;" in err, err[-2000:]
        assert "so the host undoes this rollback now" in err and "the run it was undoing stays in effect" in err, err
        assert [e for e in _events(lab_host, run_id) if e in ("finished", "rolled_back")] == ["rolled_back"]
        assert tree_hashes(lab_host.dir, skip_runs=True) == in_effect
        assert "NCCL_MIN_NCHANNELS='33'" in (lab_host.state_dir / "sglang.env").read_text()
    finally:
        client.kill()
        (lab_host.state_dir / "lab-fault.json").unlink(missing_ok=True)


def test_a_smoke_limit_below_the_first_answer_rolls_back_and_says_so(host, run_gpuops) -> None:
    lab_host, inventory = host
    waiting = _first_answer_asked(lab_host.server_port)  # the "before" prompts answer at once
    before = tree_hashes(lab_host.dir, skip_runs=True)
    try:
        done = run_gpuops("apply", "nccl-env", "-i", str(inventory), "--json",
                          *_change(60, "-e", "smoke_check=true", "-e", "gpuops_smoke_timeout=2"), timeout=300)
    finally:
        waiting.close()
    report = json.loads(done.stdout)["hosts"]["h01"]
    assert report["status"] == "rolled_back" and not report["ok"], report
    assert "gpuops_smoke_timeout=2" in report["error"], report["error"]
    assert done.returncode == 1
    assert _events(lab_host, report["run_id"])[-1] == "rolled_back"
    assert tree_hashes(lab_host.dir, skip_runs=True) == before


def test_first_answers_of_10_40_and_120_s_commit_with_the_default_limits(slow_hosts) -> None:
    """The restarted servers answer first after 10, 40 and 120 s (past the default 30 s lease for
    two of them): gpuops' smoke check waits on each while its heartbeat keeps the lease, confirms,
    and reports what each host journaled; exit 0."""
    out, err, status = slow_hosts["client"].finish(timeout=600)
    took = time.monotonic() - slow_hosts["started"]
    hosts = json.loads(out)["hosts"]
    assert took > SLOW["h120"], "the smoke check waited for the restarted server's first answer"
    for lab_host in slow_hosts["lab"].hosts:
        report = hosts[lab_host.name]
        assert report["status"] == "finished" and report["ok"], (lab_host.name, report)
        assert _events(lab_host, report["run_id"])[-1] == "finished"
        assert "NCCL_MIN_NCHANNELS='3'" in (lab_host.state_dir / "sglang.env").read_text()
    assert status == 0, err[-3000:]
    assert "most likely" not in out + err
