"""SIGTERM and SIGHUP to the client (a killed CI job, a closed terminal) end gpuops as Ctrl-C does
(issue 42): per host, the run, its step, what the host does now and the command to check; exit
128 + the signal's number; the hosts do what it says. Before, the client printed nothing.

Two lab hosts, so that the interrupt also lands while gpuops waits on parallel transactions: with
a thread pool joined at exit, a Ctrl-C over two hosts printed only "aborted" 40 s later, once both
runs had committed. The client acts once it has *said* it reached the phase (``-v``), never after a
fixed sleep (the helpers of ``test_acknowledged_commit``).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from labtools import WatchedClient, tree_hashes
from test_acknowledged_commit import _change, _events, _poll, _progress, _settled

pytestmark = pytest.mark.integration

NAMES = ("s1", "s2")


@pytest.fixture(scope="module")
def lab(lab_factory):
    from gpuops.lab.hosts import LabSpec

    return lab_factory(LabSpec(names=NAMES, count=len(NAMES), sglang=None))


def _last_run(host) -> str:
    path = host.state_dir / "journal.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["run_id"] for r in records if r["event"] == "started"][-1]


def _held(lab, command: list[str], phase: str, home: Path) -> tuple[WatchedClient, dict[str, dict[str, str]]]:
    """``command`` started with every host paused at ``phase``, once the client said so for each;
    and each host's tree before."""
    before = {}
    for host in lab.hosts:
        before[host.name] = tree_hashes(host.dir, skip_runs=True)
        (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 60}))
    calls = {host.name: set((host.state_dir / "calls").glob("*")) for host in lab.hosts}
    client = WatchedClient([*command, "-i", str(lab.inventory_path), "-v"], home)
    for host in lab.hosts:
        def paused(host=host) -> bool:
            text = _progress(host, calls[host.name])
            return '"paused"' in text and f'"phase": "{phase}"' in text

        _poll(paused, f"{host.name} never paused at {phase}")
        said = ": commit sent" if phase == "committed" else f" at {phase}\n"
        client.wait_for(f"{host.name}: run {_last_run(host)}{said}")
    return client, before


def _end(lab, client: WatchedClient) -> None:
    client.kill()
    for host in lab.hosts:
        (host.state_dir / "lab-fault.json").unlink(missing_ok=True)


def _ends_as_said(lab, client: WatchedClient, sig: signal.Signals, said: str, then: str, outcome: str,
                  trees: dict[str, dict[str, str]] | None) -> None:
    """``sig`` to the client: exit 128 + its number at once (nothing waits for the hosts' runs), its
    last line, per host the run at ``said`` and what the host does (``then``) with the command to
    check; each host journals ``outcome`` (and its files are ``trees``)."""
    try:
        client.proc.send_signal(sig)
        _, err, status = client.finish(timeout=60)
        assert status == 128 + sig, err[-3000:]
        assert ("gpuops: aborted" if sig == signal.SIGINT else f"gpuops: terminated by {sig.name}") in err, err[-2000:]
        for host in lab.hosts:
            run_id = _last_run(host)
            assert f"gpuops: {host.name}: run {run_id} was at {said}; {then}" in err, err[-3000:]
            assert f"check: gpuops history -l {host.name}" in err
            _settled(host, run_id)
            assert [e for e in _events(host, run_id) if e in ("finished", "rolled_back")] == [outcome]
            if trees is not None:
                assert tree_hashes(host.dir, skip_runs=True) == trees[host.name]
    finally:
        _end(lab, client)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_mid_apply_says_what_each_host_does_and_each_rolls_back(lab, gpuops_home, sig) -> None:
    value = {signal.SIGTERM: 51, signal.SIGHUP: 52, signal.SIGINT: 53}[sig]
    client, before = _held(lab, ["apply", "nccl-env", *_change(value)], "health", gpuops_home)
    _ends_as_said(lab, client, sig, "health", "gpuops had not confirmed it, so the host rolls it back now",
                  "rolled_back", before)


def test_sigterm_after_the_commit_was_sent_says_each_host_finishes_it(lab, gpuops_home) -> None:
    client, _ = _held(lab, ["apply", "nccl-env", *_change(54)], "committed", gpuops_home)
    _ends_as_said(lab, client, signal.SIGTERM, "verified", "gpuops had confirmed it, so the host finishes the commit",
                  "finished", None)


def test_sighup_mid_rollback_undoes_the_rollback_and_says_so(lab, gpuops_home, run_gpuops) -> None:
    applied = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--json", *_change(55))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    client, in_effect = _held(lab, ["rollback"], "before_write", gpuops_home)
    _ends_as_said(lab, client, signal.SIGHUP, "before_write",
                  "gpuops had not confirmed it, so the host undoes this rollback now", "rolled_back", in_effect)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_while_tune_benchmarks_a_variant_puts_the_hosts_back(lab, gpuops_home, tmp_path, sig) -> None:
    """The bench takes the signal as its stop (its clients stopped, what they measured kept); the
    sweep ends there too, rolls the variant back on every host and exits 143 (Ctrl-C: tune's own
    1, interrupted). Before, the bench swallowed it and tune went on to the next variant."""
    before = {h.name: tree_hashes(h.dir, skip_runs=True) for h in lab.hosts}
    client = WatchedClient(["tune", "-i", str(lab.inventory_path), "--sweep", "NCCL_MIN_NCHANNELS=3,5",
                            "--num-requests", "20", "--output-len", "32", "--warmup", "0",
                            "--results-dir", str(tmp_path / "results")], gpuops_home)
    try:
        client.wait_for("tune: benchmarking NCCL_MIN_NCHANNELS=3 ", timeout=300)
        client.proc.send_signal(sig)
        out, err, status = client.finish(timeout=300)
        assert status == (1 if sig == signal.SIGINT else 143), err[-3000:]
        assert "tune: interrupted; putting the hosts back" in err, err
        assert (sig == signal.SIGINT) is ("gpuops: terminated by" not in err), err
        assert "NCCL_MIN_NCHANNELS=5" not in err  # the next variant never began
        assert "restored: the host runs its original configuration" in out, out[-2000:]
        for host in lab.hosts:
            assert tree_hashes(host.dir, skip_runs=True) == before[host.name]
    finally:
        client.kill()
