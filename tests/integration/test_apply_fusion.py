"""gpuops apply fusion-sm120 over lab hosts with REAL SGLang releases (0.5.8, 0.5.14, 0.5.23).

The gates part finds and widens the gates (``plan_gate_patch``); these tests hold apply to its
contract on the real files: check mode touches nothing, apply patches, compiles, re-audits and
restarts with the fusion flag, a rerun does nothing, rollback restores every byte, and a patch
that does not compile is rolled back before the server is touched.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from labtools import FUSION_FLASHINFER, server_info, tree_hashes

pytestmark = pytest.mark.integration

RELEASES = ("0.5.8", "0.5.14", "0.5.23")
def audit(lab) -> dict[str, Any]:
    """A fresh gate audit of the host, through gpuops' own gather, judged for SM120."""
    from gpuops.facts.python_select import preamble_for_vars
    from gpuops.gates.evaluate import judge
    from gpuops.gates.probe import gate_scan_probe
    from gpuops.gather import gather
    from gpuops.inventory import load_inventory
    from gpuops.transport import ConnectOptions, connect

    host = load_inventory(str(lab.inventory_path)).select(None)[0]
    conn = connect(host, ConnectOptions())
    try:
        scan = gather(conn, [gate_scan_probe()], preamble=preamble_for_vars(dict(host.vars)))["gates.scan"]
    finally:
        conn.close()
    return judge(scan, "12.0", "12.8", None).features["flashinfer_allreduce_fusion"]


@pytest.fixture(scope="module")
def release_lab(lab_factory):
    """One lab host per release, shared by this module's tests: each test leaves it as it found it
    (and asserts so), which keeps the module to one SGLang unpack per release."""
    labs: dict[str, Any] = {}

    def get(release: str):
        if release not in labs:
            labs[release] = lab_factory(gpu="rtx-pro-6000-x8", sglang=release, flashinfer=FUSION_FLASHINFER)
        return labs[release]

    return get


def apply(run_gpuops, lab, *args: str, env: dict[str, str] | None = None):
    # The field box lacks P2P across its two sockets (refused by default: tests/integration/test_mixed_fleet.py).
    return run_gpuops("apply", "fusion-sm120", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=60",
                      "-e", "gpuops_stop_grace=5", "-e", "fusion_allow_without_p2p=true", *args, env=env, timeout=300)


@pytest.mark.parametrize("release", RELEASES)
def test_fusion_apply_rerun_rollback(release_lab, run_gpuops, release: str) -> None:
    lab = release_lab(release)
    host = lab.hosts[0]
    pristine = tree_hashes(host.dir, skip_runs=True)
    everything = tree_hashes(host.dir)

    check = apply(run_gpuops, lab, "--check", "--diff", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    planned = json.loads(check.stdout)["hosts"]["h01"]
    patches = [c for c in planned["changes"] if c["kind"] == "patch"]
    assert patches and all(c["path"].startswith(str(host.site_dir / "sglang")) for c in patches)
    assert all(c["diff"].startswith("---") for c in patches)
    if release == "0.5.23":  # the MNNVL gates stay closed, and the report says so
        assert any("left closed" in n and "MNNVL" in n for n in planned["notes"]), planned["notes"]
    assert tree_hashes(host.dir) == everything
    assert not (host.state_dir / "runs").exists()

    proc = apply(run_gpuops, lab, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["h01"]
    assert report["status"] == "finished" and report["changed"] >= len(patches)
    assert any("open" in note for note in report["notes"]), report["notes"]
    # The lab box is two sockets with P2P "CNS" across them: allowed by the test, still warned about.
    assert any("peer-to-peer is not possible between 16 GPU pair(s) of the TP group" in w
               and "fusion_allow_without_p2p is true" in w for w in report["warnings"]), report["warnings"]
    assert audit(lab)["status"] == "open"
    launch = (host.state_dir / "sglang-launch.sh").read_text()
    info = json.dumps(server_info(host.server_port))
    flags = [w for w in launch.split() if "allreduce" in w and w.startswith("--")]
    assert flags, launch
    assert flags[0].lstrip("-").split("=")[0].replace("-", "_") in info
    pid = int((host.state_dir / "sglang.pid").read_text())
    assert report["pid"] == pid

    again = apply(run_gpuops, lab, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads(again.stdout)["hosts"]["h01"]
    assert second["changed"] == 0 and second["status"] == "unchanged"
    assert int((host.state_dir / "sglang.pid").read_text()) == pid

    undo = run_gpuops("rollback", "-i", str(lab.inventory_path), timeout=300)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert tree_hashes(host.dir, skip_runs=True) == pristine   # every byte back: the gates are closed again


def test_patch_that_does_not_compile_is_rolled_back_before_the_restart(release_lab, run_gpuops) -> None:
    lab = release_lab("0.5.8")
    host = lab.hosts[0]
    pristine = tree_hashes(host.dir, skip_runs=True)
    pid = int((host.state_dir / "sglang.pid").read_text())
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"corrupt_patch": True}))  # honoured on lab hosts only
    proc = apply(run_gpuops, lab)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "do not compile" in proc.stdout and "rolled back" in proc.stdout
    assert tree_hashes(host.dir, skip_runs=True) == pristine
    assert int((host.state_dir / "sglang.pid").read_text()) == pid   # never restarted
    assert not list((host.site_dir / "sglang").rglob("*.pyc"))      # the compile check left no bytecode


def test_release_without_an_sm120_predicate_is_refused_untouched(release_lab, run_gpuops) -> None:
    lab = release_lab("0.4.10")
    host = lab.hosts[0]
    everything = tree_hashes(host.dir)
    proc = apply(run_gpuops, lab)
    assert proc.returncode == 1
    assert "refusing" in proc.stdout and "0.4.10" in proc.stdout and "failed=1" in proc.stdout
    assert tree_hashes(host.dir) == everything


def test_failed_re_audit_restores_the_files_and_keeps_the_server(release_lab, run_gpuops) -> None:
    lab = release_lab("0.5.14")
    host = lab.hosts[0]
    pristine = tree_hashes(host.dir, skip_runs=True)
    pid = int((host.state_dir / "sglang.pid").read_text())
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"empty_audit": True}))  # a re-audit with no scan
    proc = apply(run_gpuops, lab, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["h01"]
    assert report["status"] == "rolled_back" and "re-audit" in report["error"], report
    assert len(report["restored"]) == len(report["changes"]) and report["changed"] == 0
    assert tree_hashes(host.dir, skip_runs=True) == pristine
    assert int((host.state_dir / "sglang.pid").read_text()) == pid
    records = [json.loads(l) for l in (host.state_dir / "journal.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records if r["run_id"] == report["run_id"]] == ["started", "rolled_back"]
