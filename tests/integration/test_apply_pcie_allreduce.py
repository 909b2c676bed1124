"""gpuops apply pcie-allreduce over lab hosts with REAL SGLang releases (0.5.8, 0.5.21, 0.5.23).

The role switches SGLang's PCIe IPC all-reduce on (``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``) through
the composed launch: applied, idempotent, composed with nccl-env and fusion-sm120 in both orders,
rolled back byte for byte; on every host where it does not fit it changes nothing and says why; a
server that logs pcie_ipc_ar.py's "falling back to NCCL" line fails the host's report (and is
rolled back with ``-e pcie_rollback_on_fallback=true``). The stand-in logs the release's own lines,
deciding as pcie_ipc_ar.py does from the files on the host (tests/unit/test_pcie_ipc_facts.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from labtools import server_info, tree_hashes

from gpuops.lab.hosts import LabSpec

pytestmark = pytest.mark.integration

ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
QUICK = ("-e", "gpuops_health_timeout=60", "-e", "gpuops_stop_grace=5")
P2P = ("-e", "pcie_allow_without_p2p=true")   # the lab's field box lacks P2P across its sockets (refused by default)


@pytest.fixture(scope="module")
def labs(lab_factory):
    """One lab host per (gpu, release, launch), shared by this module's tests: each test leaves its
    host as it found it (and asserts so)."""
    made: dict[Any, Any] = {}

    def get(gpu: str = "rtx-pro-6000-x8", release: str = "0.5.23", server_args: tuple[str, ...] | None = None):
        key = (gpu, release, server_args)
        if key not in made:
            made[key] = lab_factory(LabSpec(gpu=gpu, sglang=release, server_args=server_args))
        return made[key]

    return get


def apply(run_gpuops, lab, role: str, *args: str):
    extra = P2P if role == "pcie-allreduce" and "--no-p2p-override" not in args else ()
    args = tuple(a for a in args if a != "--no-p2p-override")
    return run_gpuops("apply", role, "-i", str(lab.inventory_path), *QUICK, *extra, *args, timeout=300)


def report_of(proc) -> dict[str, Any]:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)["hosts"]["h01"]


def rollback(run_gpuops, lab) -> None:
    undo = run_gpuops("rollback", "-i", str(lab.inventory_path), timeout=300)
    assert undo.returncode == 0, undo.stdout + undo.stderr


def test_applied_in_effect_idempotent_and_rolled_back(labs, run_gpuops) -> None:
    lab = labs()
    host = lab.hosts[0]
    pristine = tree_hashes(host.dir, skip_runs=True)
    everything = tree_hashes(host.dir)

    check = apply(run_gpuops, lab, "pcie-allreduce", "--check", "--diff", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    planned = report_of(check)
    assert planned["changed"] >= 1 and any(f"{ENV}='1'" in c.get("diff", "") for c in planned["changes"]), planned
    assert tree_hashes(host.dir) == everything   # check mode touched nothing

    proc = apply(run_gpuops, lab, "pcie-allreduce", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = report_of(proc)
    assert report["status"] == "finished", report
    assert any(n.startswith('in effect: the server logged "FlashInfer PCIe-IPC all-reduce enabled (world=8')
               for n in report["notes"]), report["notes"]
    assert server_info(host.server_port)["env"].get(ENV) == "1"
    # The lab box lacks P2P across its sockets: allowed by the test, still warned about.
    assert any("peer-to-peer is not possible between 16 GPU pair(s)" in w and "going ahead" in w
               for w in report["warnings"]), report["warnings"]
    pid = int((host.state_dir / "sglang.pid").read_text())

    again = report_of(apply(run_gpuops, lab, "pcie-allreduce", "--json"))
    assert again["changed"] == 0 and again["status"] == "unchanged", again
    assert int((host.state_dir / "sglang.pid").read_text()) == pid   # not restarted

    rollback(run_gpuops, lab)
    assert tree_hashes(host.dir, skip_runs=True) == pristine
    assert ENV not in server_info(host.server_port)["env"]


def test_a_server_with_p2p_across_its_sockets_needs_no_override(labs, run_gpuops) -> None:
    """The field box's GPUs in a server whose sockets do forward P2P: applied as it stands, no
    peer-to-peer warning, in effect; rolled back."""
    lab = labs(gpu="rtx-pro-6000-p2p-x8")
    host = lab.hosts[0]
    pristine = tree_hashes(host.dir, skip_runs=True)
    report = report_of(apply(run_gpuops, lab, "pcie-allreduce", "--no-p2p-override", "--json"))
    assert report["status"] == "finished", report
    assert not [w for w in report["warnings"] if "peer-to-peer" in w], report["warnings"]
    assert any(n.startswith("in effect:") for n in report["notes"]), report["notes"]
    assert server_info(host.server_port)["env"].get(ENV) == "1"
    rollback(run_gpuops, lab)
    assert tree_hashes(host.dir, skip_runs=True) == pristine


def test_a_tp_group_without_p2p_is_refused_untouched(labs, run_gpuops) -> None:
    lab = labs()
    host = lab.hosts[0]
    everything = tree_hashes(host.dir)
    proc = apply(run_gpuops, lab, "pcie-allreduce", "--no-p2p-override")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "peer-to-peer is not possible between 16 GPU pair(s) of the TP group" in proc.stdout
    assert "pcie_allow_without_p2p=true" in proc.stdout and "failed=1" in proc.stdout
    assert tree_hashes(host.dir) == everything


def test_max_numel_sets_the_workspace_bound_and_a_bad_one_is_refused(labs, run_gpuops) -> None:
    lab = labs()
    host = lab.hosts[0]
    everything = tree_hashes(host.dir)
    bad = apply(run_gpuops, lab, "pcie-allreduce", "-e", "pcie_ipc_max_numel=12345")
    assert bad.returncode != 0 and "pcie_ipc_max_numel must be a positive whole number" in bad.stdout + bad.stderr
    assert tree_hashes(host.dir) == everything
    check = report_of(apply(run_gpuops, lab, "pcie-allreduce", "-e", "pcie_ipc_max_numel=458752", "--check",
                            "--diff", "--json"))
    assert any("SGLANG_PCIE_IPC_MAX_NUMEL='458752'" in c.get("diff", "") for c in check["changes"]), check


@pytest.mark.parametrize("other, other_args, other_sign", [
    ("nccl-env", ("-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "8"}}'), ("env", "NCCL_MIN_NCHANNELS", "8")),
    ("fusion-sm120", ("-e", "fusion_allow_without_p2p=true", "-e", "smoke_check=false"),
     ("flag", "flashinfer_allreduce_fusion_backend", "trtllm")),   # 0.5.23's flag for it
])
@pytest.mark.parametrize("pcie_first", [True, False])
def test_composes_with_the_other_roles_in_both_orders(labs, run_gpuops, other, other_args, other_sign,
                                                      pcie_first) -> None:
    lab = labs()
    host = lab.hosts[0]
    pristine = tree_hashes(host.dir, skip_runs=True)
    runs = [("pcie-allreduce", ("-e", "smoke_check=false")), (other, other_args)]
    for role, args in runs if pcie_first else runs[::-1]:
        proc = apply(run_gpuops, lab, role, *args, "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert report_of(proc)["status"] == "finished"
    info = server_info(host.server_port)
    kind, key, value = other_sign
    assert info["env"].get(ENV) == "1", info["env"]   # the later run kept the earlier one's part
    if kind == "env":
        assert info["env"].get(key) == value, info["env"]
    else:
        assert info.get(key) == value, {k: v for k, v in info.items() if "fusion" in k}
    # Undo the EARLIER run first (recomposition): the later one's part stays.
    history = json.loads(run_gpuops("history", "-i", str(lab.inventory_path), "--json").stdout)
    runs_in_effect = [r for r in history["hosts"]["h01"]["runs"] if r.get("kind", "apply") == "apply"]
    assert len(runs_in_effect) >= 2, history
    first, later = runs_in_effect[-2]["run_id"], runs_in_effect[-1]["run_id"]
    undo = run_gpuops("rollback", "-i", str(lab.inventory_path), "--run", first, timeout=300)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    info = server_info(host.server_port)
    assert (ENV in info["env"]) is (not pcie_first), info["env"]
    undo = run_gpuops("rollback", "-i", str(lab.inventory_path), "--run", later, timeout=300)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert ENV not in server_info(host.server_port)["env"]
    assert tree_hashes(host.dir, skip_runs=True) == pristine   # both undone, in that order: every byte back


@pytest.mark.parametrize("gpu, release, server_args, words", [
    ("h100-x8", "0.5.23", None, "for PCIe-only hosts; NVLink all-reduce is already fast"),
    ("rtx-pro-6000-x8", "0.5.8", None, "SGLang 0.5.21 is the first with it; upgrade to 0.5.23"),
    ("rtx-pro-6000-x8", "0.5.21", None, "FlashInfer 0.6.18 lacks the PCIe IPC all-reduce (pcie_ipc_comm)"),
    ("rtx-pro-6000-x8", "0.5.23", ("--model-path", "/models/Kimi-K2.5", "--port", "30000"), "TP 1 is not among the sizes it serves (2, 4, 8)"),
    ("rtx-pro-6000-x8", "0.5.23", ("--model-path", "/models/Kimi-K2.5", "--tp", "8", "--port", "30000",
                                   "--enable-deterministic-inference"), "deterministic inference turns it off"),
    ("rtx-pro-6000-x8", "0.5.23", ("--model-path", "/models/Kimi-K2.5", "--tp", "8", "--port", "30000",
                                   "--dtype", "float16"), "it serves bfloat16 only"),
])
def test_where_it_does_not_fit_nothing_changes_and_the_reason_is_named(labs, run_gpuops, gpu, release,
                                                                       server_args, words) -> None:
    lab = labs(gpu, release, server_args)
    host = lab.hosts[0]
    everything = tree_hashes(host.dir)
    for check in (("--check",), ()):
        proc = apply(run_gpuops, lab, "pcie-allreduce", *check, "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = report_of(proc)
        assert report["changed"] == 0, report
        reasons = [n for n in report["notes"] if n.startswith("nothing to do on this host: ")]
        assert len(reasons) == 1 and words in reasons[0] and "None" not in reasons[0], report["notes"]
        assert tree_hashes(host.dir) == everything
    plain = apply(run_gpuops, lab, "pcie-allreduce")
    assert words in plain.stdout, plain.stdout


def test_a_flashinfer_build_without_pcie_ipc_comm(labs, run_gpuops) -> None:
    """Read from the host's own FlashInfer files: a build whose flashinfer.comm does not export
    PcieIpcAllReduceWorkspace is refused before anything changes; one that names it but cannot load
    it (comm/pcie_ipc_ar.py missing: SGLang's ImportError branch) logs "falling back to NCCL", which
    fails the host's report, and is rolled back with -e pcie_rollback_on_fallback=true."""
    lab = labs()
    host = lab.hosts[0]
    pristine = tree_hashes(host.dir, skip_runs=True)
    package = host.site_dir / "flashinfer"
    assert not package.exists()   # the lab's 0.7.2 is version data only here
    (package / "comm").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    try:
        (package / "comm" / "__init__.py").write_text("from .trtllm_ar import trtllm_allreduce_fusion\n")
        everything = tree_hashes(host.dir)
        proc = apply(run_gpuops, lab, "pcie-allreduce", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = report_of(proc)
        assert report["changed"] == 0 and any("has no PcieIpcAllReduceWorkspace in flashinfer/comm/__init__.py" in n
                                              for n in report["notes"]), report["notes"]
        assert tree_hashes(host.dir) == everything

        (package / "comm" / "__init__.py").write_text(
            "from .pcie_ipc_ar import PcieIpcAllReduceWorkspace as PcieIpcAllReduceWorkspace\n")
        # An edit inside the package keeps site/'s listing, which is all the kept GPU facts'
        # fingerprint sees of it (apply/kept_facts.py): gather afresh, as after any such edit.
        proc = apply(run_gpuops, lab, "pcie-allreduce", "-e", "smoke_check=false", "--flush-cache", "--json")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        report = report_of(proc)
        assert report["status"] == "finished" and not report["ok"], report
        assert "falling back to NCCL all-reduce" in report["error"] and "pcie_rollback_on_fallback" in report["error"]
        rollback(run_gpuops, lab)

        pid = int((host.state_dir / "sglang.pid").read_text())
        proc = apply(run_gpuops, lab, "pcie-allreduce", "-e", "smoke_check=false", "-e",
                     "pcie_rollback_on_fallback=true", "--json")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        report = report_of(proc)
        assert report["status"] == "rolled_back", report
        assert "falling back to NCCL all-reduce" in report["error"], report
        assert ENV not in server_info(host.server_port)["env"]
        assert int((host.state_dir / "sglang.pid").read_text()) != pid   # the previous launch, started again
    finally:
        import shutil

        shutil.rmtree(package)
    assert tree_hashes(host.dir, skip_runs=True) == pristine
