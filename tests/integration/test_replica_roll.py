"""Replicas behind the real sglang-router (0.3.2, and 0.2.4 once, from PyPI, cached): a rolling change loses no request.

Three lab hosts with a real router in front of their stand-ins (``gpuops lab up --router``), a
bounded load through the router (``loadgen``: streaming requests, each counted, from before the
apply until it is over) during ``gpuops apply nccl-env --serial 1``. Without the router named the same roll drops
requests (the issue's failure, reproduced); with it, none.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from loadgen import StreamingLoad
from labtools import tree_hashes

from gpuops.lab.hosts import Lab, LabSpec, start_lab, stop_lab
from gpuops.lab.router import load_router

# Requests of ~2 s each (128 tokens at the stand-in's ~60 tok/s): long enough that a replica stopped
# without waiting for its requests cuts them (a take-out alone, with the restart's own delay, is not).
CLIENTS, PER_CLIENT, TOKENS = 4, 60, 128
# PER_CLIENT bounds a client (a roll that hangs must not stream on forever); the load stops once the
# apply is over (``load.stop()``), and every client must still have been sending then.


def _router_lab(tmp_path_factory: pytest.TempPathFactory, specs: list[LabSpec]) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("routerlab") / "lab"
    lab = start_lab(root, specs, router="0.3.2")
    try:
        yield lab
    finally:
        stop_lab(lab.root)


@pytest.fixture(scope="module")
def shared_router_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Three replicas behind the router, borrowed in turn by the tests below in file order: each
    begins by asserting every replica is in the router and healthy, applies a setting the one
    before it did not leave (4, then 8, then 6), and hands the lab back with every replica in the
    router, except the last (it stops the router). One lab start instead of three (~5-15 s each)."""
    yield from _router_lab(tmp_path_factory, [LabSpec(count=3)])


@pytest.fixture
def router_lab(tmp_path_factory: pytest.TempPathFactory, request: Any) -> Iterator[Lab]:
    """A lab of this test's own (``request.param``: its specs), for a test that needs other hosts."""
    yield from _router_lab(tmp_path_factory, request.param)


def _router_url(lab: Lab) -> str:
    found = load_router(lab.root)
    assert found is not None
    return found.url


def test_a_roll_behind_the_older_router_0_2_loses_no_request(tmp_path: Path, run_gpuops: Any) -> None:
    """sglang-router 0.2.4 names a worker by its URL (``/workers/{url}``) where 0.3 takes a UUID:
    gpuops tells which from the router's answers. One cheap roll: two replicas, a short load."""
    lab = start_lab(tmp_path / "lab", [LabSpec(count=2)], router="0.2.4")
    try:
        assert _workers(lab) == _all_in_router(lab)
        # Requests of ~1 s (64 tokens), enough to be cut by a restart that does not drain, until the
        # roll is over (the roll of two replicas takes ~14 s here; 120 per client only bounds it).
        load = StreamingLoad(_router_url(lab), clients=2, requests_per_client=120, max_new_tokens=64).start()
        load.wait_started(2)
        proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--serial", "1", "--json",
                          "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "4"}}', timeout=300)
        served_during = load.done_count
        result = load.stop().join()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        print(f"0.2.4, with the drain: {result.summary()} ({served_during} served during the roll)")
        assert result.clients_cut_short == 2 and served_during < result.total, "the load ended before the roll did"
        assert result.failed == 0, result.failures[:5]
        hosts = json.loads(proc.stdout)["hosts"]
        for host in lab.hosts:
            assert hosts[host.name]["status"] == "finished", hosts[host.name]
            assert "NCCL_MIN_NCHANNELS='4'" in _env(lab, host.name)
            notes = " | ".join(hosts[host.name]["notes"])
            assert "drained: out of router" in notes and "put back: router" in notes, notes
        assert _workers(lab) == _all_in_router(lab)  # every replica back and healthy
    finally:
        stop_lab(lab.root)


def _workers(lab: Lab) -> dict[str, bool]:
    with urllib.request.urlopen(_router_url(lab) + "/workers", timeout=10) as reply:
        return {w["url"]: w["is_healthy"] for w in json.loads(reply.read())["workers"]}


def _all_in_router(lab: Lab) -> dict[str, bool]:
    return {f"http://127.0.0.1:{h.server_port}": True for h in lab.hosts}


def _apply_under_load(run_gpuops: Any, lab: Lab, *args: str) -> tuple[subprocess.CompletedProcess, Any, int]:
    """The apply, with the bounded load running through the router from before it until after it."""
    load = StreamingLoad(_router_url(lab), clients=CLIENTS, requests_per_client=PER_CLIENT,
                         max_new_tokens=TOKENS).start()
    load.wait_started(CLIENTS)
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), *args, timeout=400)
    served_during = load.done_count
    result = load.stop().join()
    # The load outlasted the roll: every restart happened while every client streamed.
    assert result.clients_cut_short == CLIENTS, "a client ran out of requests before the roll ended: raise PER_CLIENT"
    assert served_during < result.total <= CLIENTS * PER_CLIENT
    return proc, result, served_during


def _env(lab: Lab, name: str) -> str:
    return (lab.host(name).state_dir / "sglang.env").read_text()


def test_a_roll_behind_the_router_loses_no_request(shared_router_lab: Lab, run_gpuops: Any) -> None:
    lab = shared_router_lab
    assert _workers(lab) == _all_in_router(lab)
    # First as a new user ran it: the router not named (-e empties the lab's group var). The
    # restarts cut streams short: the failure the issue reports.
    proc, before_fix, _ = _apply_under_load(run_gpuops, lab, "--serial", "1", "-e",
                                            '{"nccl_env": {"NCCL_MIN_NCHANNELS": "8"}, "sglang_router_url": ""}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "name no router (sglang_router_url)" in proc.stdout  # the warning for look-alike replicas
    print(f"without the drain: {before_fix.summary()}")
    assert before_fix.failed > 0, "the load generator saw no failure where restarts cut streams"

    proc, result, _ = _apply_under_load(run_gpuops, lab, "--serial", "1", "--json",
                                        "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "4"}}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"with the drain: {result.summary()}")
    assert result.failed == 0, result.failures[:5]
    hosts = json.loads(proc.stdout)["hosts"]
    for host in lab.hosts:
        assert hosts[host.name]["status"] == "finished"
        assert "NCCL_MIN_NCHANNELS='4'" in _env(lab, host.name)
        notes = " | ".join(hosts[host.name]["notes"])
        assert "drained: out of router" in notes and "put back: router" in notes, notes
    assert _workers(lab) == _all_in_router(lab)  # every replica back and healthy


@pytest.mark.parametrize("router_lab", [[
    LabSpec(count=1, names=("h01",)),
    LabSpec(count=1, names=("h02",), server_env={"GPUOPS_STANDIN_CRASH_IF": "NCCL_MIN_NCHANNELS=2"}),
    LabSpec(count=1, names=("h03",)),
]], indirect=True)
def test_a_failing_replica_is_rolled_back_put_back_and_stops_the_roll(router_lab: Lab, run_gpuops: Any) -> None:
    lab = router_lab
    h02_before = tree_hashes(lab.host("h02").dir, skip_runs=True)
    h03_before = tree_hashes(lab.host("h03").dir)
    proc, result, _ = _apply_under_load(run_gpuops, lab, "--serial", "1", "--max-fail-percentage", "0", "--json",
                                        "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "2"}}')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["h01"]["status"] == "finished"
    assert hosts["h02"]["status"] == "rolled_back", hosts["h02"]
    assert hosts["h03"]["status"] == "skipped"
    assert "put back: router" in " | ".join(hosts["h02"]["notes"])  # the old setting serves again
    assert result.failed == 0, result.failures[:5]
    assert "NCCL_MIN_NCHANNELS='2'" in _env(lab, "h01")
    assert tree_hashes(lab.host("h02").dir, skip_runs=True) == h02_before
    assert tree_hashes(lab.host("h03").dir) == h03_before  # never touched
    assert _workers(lab) == _all_in_router(lab)


def test_lab_up_router_cli(tmp_path: Path, run_gpuops: Any) -> None:
    """``gpuops lab up --router``: the router runs, the inventory names it, status and down see it."""
    lab_dir = tmp_path / "lab"
    proc = run_gpuops("lab", "up", "--hosts", "2", "--router", "--dir", str(lab_dir), "--json", timeout=300)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        router = doc["router"]
        assert router["version"] == "0.3.2" and router["alive"] is True
        import yaml

        inventory = yaml.safe_load(Path(doc["inventory"]).read_text())
        assert inventory["all"]["children"]["lab"]["vars"]["sglang_router_url"] == router["url"]
        with urllib.request.urlopen(router["url"] + "/workers", timeout=10) as reply:
            listed = sorted(w["url"] for w in json.loads(reply.read())["workers"])
        assert listed == sorted(f"http://127.0.0.1:{h['server_port']}" for h in doc["hosts"])
    finally:
        down = run_gpuops("lab", "down", "--dir", str(lab_dir), "--json")
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["swept_pids"] == []  # the router was stopped by its pid, not swept
    assert not _pid_alive(router["pid"])


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_client_killed_mid_roll_leaves_word_and_the_next_run_puts_the_replica_back(
        shared_router_lab: Lab, run_gpuops: Any, gpuops_home: Path) -> None:
    from labtools import client_paused_at, rolled_back_count

    lab = shared_router_lab
    h01 = lab.host("h01")
    inventory = str(lab.inventory_path)
    extra = json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": "8"}, "gpuops_lease": 3})
    load = StreamingLoad(_router_url(lab), clients=CLIENTS, requests_per_client=2 * PER_CLIENT,
                         max_new_tokens=TOKENS).start()
    load.wait_started(CLIENTS)
    # h01 out of the router, drained, restarted: the client dies while its worker checks health.
    client = client_paused_at(h01.state_dir, "health", ["apply", "nccl-env", "-i", inventory, "--serial", "1",
                                                        "-e", extra], gpuops_home, timeout=120)
    assert f"http://127.0.0.1:{h01.server_port}" not in _workers(lab)
    client.kill()
    client.wait(timeout=30)
    records = list((gpuops_home / ".local" / "state" / "gpuops" / "replicas-out").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["host"] == "h01"
    deadline = time.monotonic() + 60
    while rolled_back_count(h01.state_dir) < 1:  # the host rolls itself back once its lease lapses
        assert time.monotonic() < deadline, "h01 never rolled itself back"
        time.sleep(0.2)
    assert f"http://127.0.0.1:{h01.server_port}" not in _workers(lab)  # still out: nobody put it back

    check = run_gpuops("apply", "nccl-env", "-i", inventory, "--check", "-e", extra)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "taken out of router" in check.stdout and "by an earlier gpuops run that did not finish" in check.stdout
    proc = run_gpuops("apply", "nccl-env", "-i", inventory, "--serial", "1", "--json", "-e", extra, timeout=400)
    served_during = load.done_count
    result = load.stop().join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert all(hosts[h.name]["status"] == "finished" for h in lab.hosts), hosts
    assert "nothing to drain" in " | ".join(hosts["h01"]["notes"])
    assert _workers(lab) == _all_in_router(lab)
    assert not list(records[0].parent.glob("*.json"))  # the word is taken back with the replica
    assert result.clients_cut_short == CLIENTS, "a client ran out of requests before the roll ended"
    assert served_during < result.total and result.failed == 0, result.summary()


def test_check_shows_the_drain_plan_and_a_router_down_refuses_every_restart(shared_router_lab: Lab,
                                                                            run_gpuops: Any) -> None:
    """Last of the shared lab's tests: it stops the router."""
    lab = shared_router_lab
    before = {h.name: tree_hashes(h.dir) for h in lab.hosts}
    inventory = str(lab.inventory_path)
    extra = '{"nccl_env": {"NCCL_MIN_NCHANNELS": "6"}}'  # a change on every replica: the lab is on 4 or 8
    proc = run_gpuops("apply", "nccl-env", "-i", inventory, "--check", "--serial", "1", "-e", extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("drain plan: ") == 3
    assert f"behind router {_router_url(lab)}: before its restart it is taken out" in proc.stdout
    assert _workers(lab) == _all_in_router(lab)  # --check takes nothing out

    found = load_router(lab.root)
    assert found is not None
    from gpuops.lab.router import stop_router

    stop_router(lab.root)
    deadline = time.monotonic() + 10
    while found.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Running replicas are never restarted without being taken out first: each is refused, nothing
    # changed (a replica whose server does not run would be started: tests/integration/test_first_deploy.py).
    proc = run_gpuops("apply", "nccl-env", "-i", inventory, "--json", "-e", extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for report in json.loads(proc.stdout)["hosts"].values():
        assert report["status"] == "refused" and report["changed"] == 0, report
        assert report["error"].startswith(f"router {found.url}: cannot reach it"), report["error"]
        assert report["error"].endswith("a running replica is restarted only once it is out of its router and "
                                        "drained; nothing changed"), report["error"]
    assert {h.name: tree_hashes(h.dir) for h in lab.hosts} == before
