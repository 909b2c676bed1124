"""The two-node deployment lab of test_deployment_roll, test_deployment_rollback and
test_deployment_split (one lab per module, so that the three run on parallel workers): its nodes,
the runs the tests make on it, and what they wait for.

Two lab nodes running the stand-in as SGLang's nodes (``--nnodes 2 --node-rank R --dist-init-addr``:
node 0 healthy only once node 1 joined, one node gone takes the other down). Faults come from the
lab's fault file (``lab/host_faults.py``) and SIGKILLs from outside gpuops' code path.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from labtools import progress_records
from test_apply_faults import calls, client, journal_events, paused, wait_host_settled

from gpuops.lab.hosts import Lab, LabSpec
from gpuops.lab.ports import free_port

LEASE = 4


def node_args(rank: int, addr: str) -> tuple[str, ...]:
    return ("--model-path", "/models/Kimi-K2.5", "--tp", "16", "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", addr)


def start_nodes(lab_factory: Any) -> tuple[Lab, int]:
    """Two lab nodes n0 (the leader) and n1 of deployment kimi (TP 16 over 2 hosts), and their init port."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    lab = lab_factory(LabSpec(count=1, names=("n0",), server_args=node_args(0, addr)),
                      LabSpec(count=1, names=("n1",), server_args=node_args(1, addr)))
    return lab, port


def extra_vars(port: int, value: int, *more: str) -> list[str]:
    return ["-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": str(value)}, "sglang_deployment": "kimi",
                              "sglang_dist_port": port, "gpuops_health_timeout": 30, "gpuops_lease": LEASE}),
            *more]


def env_file(lab: Lab, name: str) -> str:
    return (lab.host(name).state_dir / "sglang.env").read_text()


def http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read()
    except OSError:
        return 0, b""


def settled(lab: Lab, value: int, timeout: float = 90) -> None:
    """Both nodes' launch files hold ``value``, the leader serves it, the worker answers /health:
    polled, since a rollback's restart may still be under way when the client returns."""
    want = f"NCCL_MIN_NCHANNELS='{value}'"
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        files = {n: want in env_file(lab, n) for n in ("n0", "n1")}
        status, body = http_get(lab.host("n0").server_port, "/get_server_info")
        served = json.loads(body).get("env", {}).get("NCCL_MIN_NCHANNELS") if status == 200 else None
        worker = http_get(lab.host("n1").server_port, "/health")[0]
        seen = (files, served, worker)
        if all(files.values()) and served == str(value) and worker == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"not settled on {value}: files {seen[0]}, leader serves {seen[1]!r}, worker /health "
                         f"{seen[2]}\n{nodes_said(lab)}")


def nodes_said(lab: Lab) -> str:
    """Each node's last journal events and server log lines: what a failure report needs to say why
    (a flake seen once in a loaded whole run is otherwise gone with its lab)."""
    said = []
    for name in ("n0", "n1"):
        state = lab.host(name).state_dir
        journal = (state / "journal.jsonl").read_text().splitlines()[-8:] if (state / "journal.jsonl").exists() else []
        log = state / "sglang.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else [f"{log} absent"]
        said.append(f"{name}: journal\n    " + "\n    ".join(journal) + "\n  sglang.log:\n    " + "\n    ".join(tail))
    return "\n".join(said)


def baseline(run_gpuops: Any, lab: Lab, port: int) -> None:
    """Both nodes on NCCL_MIN_NCHANNELS=4 (a no-op when an earlier test left them there)."""
    code, hosts = apply_value(run_gpuops, lab, port, 4)
    assert code == 0, {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    settled(lab, 4)


def put_fault(lab: Lab, name: str, fault: dict[str, Any]) -> None:
    (lab.host(name).state_dir / "lab-fault.json").write_text(json.dumps(fault))


def apply_value(run_gpuops: Any, lab: Lab, port: int, value: int, *more: str) -> tuple[int, dict[str, Any]]:
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--json", *extra_vars(port, value), *more,
                      timeout=300)
    return proc.returncode, json.loads(proc.stdout)["hosts"]


def server_pid(lab: Lab, name: str) -> int:
    return int((lab.host(name).state_dir / "sglang.pid").read_text().split()[0])



def worker_of(host: Any, earlier: set[Path]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for progress in sorted(p / "progress.jsonl" for p in calls(host) - earlier):
            for record in progress_records(progress):
                if record.get("event") == "worker":
                    return {"dir": progress.parent, "worker": record["pid"], "relay": record["relay"]}
        time.sleep(0.05)
    raise AssertionError("no worker")


def committed_run(run_gpuops: Any, lab: Lab, port: int, value: int) -> None:
    """Both nodes on the old setting 4, then ``value`` applied and committed (the run to undo)."""
    baseline(run_gpuops, lab, port)
    code, hosts = apply_value(run_gpuops, lab, port, value, "-e", json.dumps({"gpuops_health_timeout": 6}))
    assert code == 0, hosts
    settled(lab, value)


def rollback_all(run_gpuops: Any, lab: Lab, *more: str) -> tuple[int, dict[str, Any]]:
    proc = run_gpuops("rollback", "-i", str(lab.inventory_path), "--json", *more, timeout=300)
    return proc.returncode, json.loads(proc.stdout)["hosts"]



def split_run(run_gpuops: Any, lab: Lab, port: int, gpuops_home: Path, value: int, committed: str,
           kill: bool = True) -> tuple[str, bytes]:
    """Run ``value`` committed on node ``committed`` and rolled back on the other by its lease
    (``between_commits``); returns the run id and the client's stdout (``kill``: it was killed)."""
    baseline(run_gpuops, lab, port)
    run_id, out = between_commits(lab, committed, lambda: client(
        lab, "nccl-env", "-v", "--json", *extra_vars(port, value), "-e",
        json.dumps({"gpuops_health_timeout": 6, "gpuops_lease": 8}), home=gpuops_home), kill)
    frozen = "n1" if committed == "n0" else "n0"
    if kill:
        assert f"NCCL_MIN_NCHANNELS='{value}'" in env_file(lab, committed)
        assert f"NCCL_MIN_NCHANNELS='{value}'" not in env_file(lab, frozen)  # split: the state this test is for
    return run_id, out


def between_commits(lab: Lab, committed: str, start: Any, kill: bool = True) -> tuple[str, bytes]:
    """A run (``start()``: gpuops -v --json in its own process) committed on node ``committed`` and
    rolled back on the other by its lease, deterministically: the committing node holds at its
    confirm until released, the other's session is frozen (SIGSTOP of its relay) once gpuops has
    heard it verified, so the commit sent to it stays unread; once the first node has committed the
    client is SIGKILLed (unless not ``kill``), and the frozen node's lease lapses."""
    frozen = "n1" if committed == "n0" else "n0"
    earlier = {n: calls(lab.host(n)) for n in ("n0", "n1")}
    seen = {n: len(journal_events(lab.host(n))) for n in ("n0", "n1")}
    put_fault(lab, committed, {"pause_at": "confirm", "seconds": 120, "until": "lab-release"})
    proc = start()
    heard = stderr_lines(proc)
    paused(lab.host(committed), "confirm", proc, earlier[committed])
    worker = frozen_once_verified(lab, frozen, proc, heard, earlier[frozen])
    release = lab.host(committed).state_dir / "lab-release"
    try:
        release.touch()
        run_id = wait_event(lab.host(committed), ("finished",), seen[committed])
        if kill:
            proc.kill()
            proc.communicate()
        wait_event(lab.host(frozen), ("rolled_back", "rollback_failed"), seen[frozen], run_id)
    finally:
        os.kill(worker["relay"], signal.SIGCONT)
        release.unlink(missing_ok=True)
    if not kill:
        out, _ = proc.communicate(timeout=240)
        return run_id, out
    wait_host_settled(lab.host(frozen), worker)
    return run_id, b""


def stderr_lines(proc: Any) -> list[bytes]:
    """The lines ``proc`` (gpuops -v) writes to stderr, as they come (read by a thread of their own)."""
    heard: list[bytes] = []
    stderr = proc.stderr
    assert stderr is not None
    threading.Thread(target=lambda: heard.extend(iter(stderr.readline, b"")), daemon=True).start()
    return heard


def frozen_once_verified(lab: Lab, name: str, proc: Any, heard: list[bytes], earlier: set[Path]) -> dict[str, Any]:
    """Node ``name``'s worker of this run (``worker_of``), its session frozen (SIGSTOP of its relay)
    once gpuops said it heard the node verified (``heard``: its -v stderr), so that gpuops waits at
    the commit and the commit it sends stays unread; the caller sends SIGCONT."""
    worker = worker_of(lab.host(name), earlier)
    deadline = time.monotonic() + 60
    while not any(f"{name}: run ".encode() in line and b"verified on the host" in line for line in heard):
        assert time.monotonic() < deadline and proc.poll() is None, b"".join(heard)[-2000:]
        time.sleep(0.05)
    os.kill(worker["relay"], signal.SIGSTOP)
    return worker


def wait_event(host: Any, events: tuple[str, ...], after: int, run_id: str | None = None) -> str:
    """The run id of the run that ``host``'s journal (past its first ``after`` records) ends with one of ``events``."""
    deadline = time.monotonic() + 90
    while True:
        for rid, event in journal_events(host)[after:]:
            if event in events and run_id in (None, rid):
                return rid
        assert time.monotonic() < deadline, (events, journal_events(host)[-4:])
        time.sleep(0.1)


def undone_on_both(lab: Lab, run_id: str) -> None:
    """Each node's journal: a finished rollback of ``run_id`` (the repair) that restarted its
    previous server, the node that had rolled the run back already too (with the others)."""
    for name in ("n0", "n1"):
        lines = (lab.host(name).state_dir / "journal.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        undone = [r for r in records if r["event"] == "finished" and r.get("kind") == "rollback"
                  and r.get("target") == run_id]
        assert undone and "previous server configuration restarted and healthy" in undone[-1].get("service", ""), \
            (name, records[-4:])




def verified_worker(lab: Lab, name: str, earlier: set[Path]) -> dict[str, Any]:
    """The node's worker of this run (``worker_of``), once it was verified (healthy, waiting for its
    commit): its progress file says so."""
    worker = worker_of(lab.host(name), earlier)
    progress = Path(worker["dir"]) / "progress.jsonl"
    deadline = time.monotonic() + 60
    while not (progress.exists() and '"event": "verified"' in progress.read_text()):
        assert time.monotonic() < deadline, f"node {name} was never verified"
        time.sleep(0.05)
    return worker
