"""A first deployment from nothing: sglang-service starts servers that do not run (Ansible's
`state: started`), and replicas behind the real sglang-router (0.3.2, from PyPI, cached) end serving
behind it, registered through the router's own API; a router that is down is said so per host.

Lab hosts started without their server (`LabSpec(server=False)`: the launch files are in place, no
process runs), over real sshd, with the stand-in server.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from typing import Any

import pytest

from labtools import server_info, tree_hashes

from gpuops.lab.hosts import Lab, LabSpec
from gpuops.lab.router import start_router, stop_router

pytestmark = pytest.mark.integration


def _apply(run_gpuops: Any, lab: Lab, *args: str) -> subprocess.CompletedProcess:
    return run_gpuops("apply", "sglang-service", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=30",
                      "-e", "gpuops_stop_grace=5", *args, timeout=300)


def _serving(lab: Lab) -> dict[str, bool]:
    out = {}
    for host in lab.hosts:
        try:
            out[host.name] = bool(server_info(host.server_port))
        except OSError:
            out[host.name] = False
    return out


def _workers(router_url: str) -> dict[str, bool]:
    with urllib.request.urlopen(router_url + "/workers", timeout=10) as reply:
        listed = json.loads(reply.read())["workers"]
    urls = [w["url"] for w in listed]
    assert len(urls) == len(set(urls)), f"a worker is listed twice: {urls}"  # gpuops' POST and the router's own retry
    return {w["url"]: w["is_healthy"] for w in listed}


def _urls(lab: Lab) -> list[str]:
    # the lab's inventory names each host by ansible_host 127.0.0.1: the worker URL gpuops builds by default
    return [f"http://127.0.0.1:{h.server_port}" for h in lab.hosts]


def test_a_stopped_server_is_started_through_the_transaction_and_said_so(lab_factory: Any, run_gpuops: Any) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, server=False)
    host = lab.hosts[0]
    assert _serving(lab) == {"h01": False}
    before = tree_hashes(host.dir)

    check = _apply(run_gpuops, lab, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"would start the server: none runs on port {host.server_port}" in check.stdout, check.stdout
    assert "would run handler: restart sglang" in check.stdout and "changed=1" in check.stdout
    assert tree_hashes(host.dir) == before and _serving(lab) == {"h01": False}

    proc = _apply(run_gpuops, lab, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["h01"]
    assert report["status"] == "finished" and report["changed"] == 1 and report["changes"] == [], report
    assert report["notes"][0].startswith(f"started: no server ran on port {host.server_port}"), report["notes"]
    assert report["pid"] == int((host.state_dir / "sglang.pid").read_text())
    assert _serving(lab) == {"h01": True}

    again = _apply(run_gpuops, lab, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads(again.stdout)["hosts"]["h01"]
    assert second["status"] == "unchanged" and second["changed"] == 0, second
    assert second["pid"] is None and int((host.state_dir / "sglang.pid").read_text()) == report["pid"]


def test_a_first_deploy_behind_a_router_with_no_workers_ends_with_every_replica_serving_behind_it(
        lab_factory: Any, run_gpuops: Any) -> None:
    lab = lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang=None, server=False, count=2))
    # A router started with --worker-urls before its workers serve: it lists none of them.
    router = start_router(lab.root, _urls(lab), await_healthy=False)
    try:
        assert _workers(router.url) == {}
        proc = _apply(run_gpuops, lab, "--json", "-e", f"sglang_router_url={router.url}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        hosts = json.loads(proc.stdout)["hosts"]
        for host in lab.hosts:
            report = hosts[host.name]
            assert report["status"] == "finished", report
            notes = " | ".join(report["notes"])
            print(f"{host.name}: {notes}")  # which way it joined (POST /workers, or listed by the router itself)
            assert f"joined: router {router.url} lists it healthy" in notes, notes
            assert "drained" not in notes  # nothing ran: nothing to drain
        assert _serving(lab) == {h.name: True for h in lab.hosts}
        assert _workers(router.url) == {url: True for url in _urls(lab)}

        again = _apply(run_gpuops, lab, "--json", "-e", f"sglang_router_url={router.url}")
        assert again.returncode == 0, again.stdout + again.stderr
        assert {r["status"] for r in json.loads(again.stdout)["hosts"].values()} == {"unchanged"}
        assert _workers(router.url) == {url: True for url in _urls(lab)}  # the router's own retries added none twice
    finally:
        stop_router(lab.root)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_router_that_is_down_gets_its_replicas_started_said_so_and_the_next_run_puts_them_in(
        lab_factory: Any, run_gpuops: Any) -> None:
    lab = lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang=None, server=False, count=2))
    down = f"http://127.0.0.1:{_free_port()}"
    proc = _apply(run_gpuops, lab, "--json", "-e", f"sglang_router_url={down}")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    for host in lab.hosts:
        report = hosts[host.name]
        assert report["status"] == "finished" and not report["ok"], report
        assert report["error"].startswith(f"started and healthy, but not behind its router: router {down}: "
                                          "cannot reach it"), report["error"]
    assert _serving(lab) == {h.name: True for h in lab.hosts}

    # The router comes up (before its workers are known to it): the next run puts each replica in.
    port = int(down.rsplit(":", 1)[1])
    router = start_router(lab.root, [], await_healthy=False, port=port)
    try:
        proc = _apply(run_gpuops, lab, "--json", "-e", f"sglang_router_url={router.url}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for host in lab.hosts:
            report = json.loads(proc.stdout)["hosts"][host.name]
            assert report["ok"] and f"put back: router {router.url} lists it healthy" in " | ".join(report["notes"])
        assert _workers(router.url) == {url: True for url in _urls(lab)}
    finally:
        stop_router(lab.root)
