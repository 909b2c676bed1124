"""One mixed inventory of three lab host shapes, real SGLang releases, real sshd:

- ``field``: 8x RTX PRO 6000 Server (sm120, PCIe, no P2P across its two sockets), sglang 0.5.8
- ``hopper``: 8x H100 SXM (sm90, NVLink), sglang 0.5.23 (fusion already runs there)
- ``ws``: 4x RTX PRO 6000 Workstation (sm120, PCIe, P2P between all pairs), sglang 0.5.14

fusion-sm120 changes exactly the sm120 hosts and exits 0; the P2P refusal and its override; roles
compose in both orders, and each rollback removes exactly its run's part.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from labtools import FUSION_FLASHINFER, launched, tree_hashes

pytestmark = pytest.mark.integration

# Generous health wait: a loaded 2-core machine restarts three stand-in servers at once.
FAST = ("-e", "gpuops_health_timeout=300", "-e", "gpuops_stop_grace=5")
TREE = '{"nccl_env": {"NCCL_ALGO": "Tree"}}'


@pytest.fixture(scope="module")
def fleet(lab_factory):
    from gpuops.lab.hosts import LabSpec

    return lab_factory(
        LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("field",), flashinfer=FUSION_FLASHINFER),
        LabSpec(gpu="h100-x8", sglang="0.5.23", names=("hopper",)),
        LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.14", names=("ws",), flashinfer=FUSION_FLASHINFER),
    )


def gpuops_json(run_gpuops, *args: str) -> tuple[int, dict[str, Any]]:
    proc = run_gpuops(*args, "--json", timeout=400)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(proc.stdout + proc.stderr) from None


def test_fusion_changes_exactly_the_sm120_hosts(fleet, run_gpuops) -> None:
    inv = str(fleet.inventory_path)
    hosts = {h.name: h for h in fleet.hosts}
    before = {name: tree_hashes(h.dir) for name, h in hosts.items()}

    rc, check = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "--check", *FAST)
    by = check["hosts"]
    # The field box's TP group (8 GPUs over two sockets) lacks P2P: refused, saying why and how.
    assert rc == 1 and not by["field"]["ok"]
    assert "IPC" in by["field"]["error"] and "fusion_allow_without_p2p=true" in by["field"]["error"]
    # The H100: nothing to do (fusion already runs on sm90 in this release), with the reason.
    assert by["hopper"]["ok"] and by["hopper"]["changed"] == 0
    assert any("sm90" in n and "already runs FlashInfer allreduce" in n for n in by["hopper"]["notes"]), by["hopper"]["notes"]
    # The workstation: P2P everywhere, so the patch is planned.
    assert by["ws"]["ok"] and by["ws"]["changed"] > 0, (by["ws"].get("error"), by["ws"].get("notes"))
    assert {name: tree_hashes(h.dir) for name, h in hosts.items()} == before

    rc, done = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-e", "fusion_allow_without_p2p=true", *FAST)
    by = done["hosts"]
    assert rc == 0, {name: (h["status"], h.get("error"), h.get("log_tail")) for name, h in by.items()}
    assert by["field"]["status"] == "finished" and by["ws"]["status"] == "finished"
    assert by["hopper"]["status"] == "unchanged" and by["hopper"]["changed"] == 0
    assert any("fusion_allow_without_p2p is true" in w for w in by["field"]["warnings"])
    assert tree_hashes(hosts["hopper"].dir) == before["hopper"]            # not one byte on the H100
    for name in ("field", "ws"):
        assert launched(hosts[name])[0], name

    # Roles compose: nccl-env keeps the fusion flag; fusion again changes nothing.
    rc, tuned = gpuops_json(run_gpuops, "apply", "nccl-env", "-i", inv, "-l", "field:ws", "-e", TREE, *FAST)
    assert rc == 0, {name: (h["status"], h.get("error")) for name, h in tuned["hosts"].items()}
    for name in ("field", "ws"):
        flags, env = launched(hosts[name])
        assert flags and env.get("NCCL_ALGO") == "Tree", (flags, env)
    rc, again = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-e", "fusion_allow_without_p2p=true", *FAST)
    assert rc == 0 and all(h["changed"] == 0 for h in again["hosts"].values()), again

    # Rolling back the NCCL run removes its part only; then the fusion run: the hosts are pristine.
    undo = run_gpuops("rollback", "-i", inv, "-l", "field:ws", timeout=400)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    for name in ("field", "ws"):
        flags, env = launched(hosts[name])
        assert flags and "NCCL_ALGO" not in env, (flags, env)
    undo = run_gpuops("rollback", "-i", inv, "-l", "field:ws", timeout=400)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    for name in ("field", "ws"):
        assert tree_hashes(hosts[name].dir, skip_runs=True) == _pristine(before[name]), name


def test_composition_in_the_other_order(fleet, run_gpuops) -> None:
    inv = str(fleet.inventory_path)
    ws = next(h for h in fleet.hosts if h.name == "ws")
    pristine = tree_hashes(ws.dir, skip_runs=True)
    assert gpuops_json(run_gpuops, "apply", "nccl-env", "-i", inv, "-l", "ws", "-e", TREE, *FAST)[0] == 0
    rc, fused = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "ws", *FAST)
    assert rc == 0 and fused["hosts"]["ws"]["status"] == "finished", fused
    flags, env = launched(ws)
    assert flags and env.get("NCCL_ALGO") == "Tree"
    rc, shown = gpuops_json(run_gpuops, "inspect", "host", "-i", inv, "-l", "ws")
    managed = shown["hosts"]["ws"]["managed_launch"]
    assert "nccl-env" in [r["role"] for r in managed["runs"]] and managed["env"]["NCCL_ALGO"] == "Tree"
    assert any("allreduce-fusion" in a for a in managed["args"])
    text = run_gpuops("inspect", "host", "-v", "-i", inv, "-l", "ws", timeout=400).stdout
    assert "managed by gpuops: flags --" in text and "NCCL_ALGO=Tree" in text and "from runs nccl-env" in text
    # Undo the fusion run: the NCCL variables stay.
    assert run_gpuops("rollback", "-i", inv, "-l", "ws", timeout=400).returncode == 0
    flags, env = launched(ws)
    assert not flags and env.get("NCCL_ALGO") == "Tree"
    assert run_gpuops("rollback", "-i", inv, "-l", "ws", timeout=400).returncode == 0
    assert tree_hashes(ws.dir, skip_runs=True) == pristine


def _pristine(hashes: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in hashes.items() if not k.startswith("state/runs/") and not k.endswith(("journal.jsonl", "lock"))}
