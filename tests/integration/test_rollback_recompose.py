"""Rolling back an OLDER run while later runs stand: the launch is recomposed without its part.

Two lab hosts shaped as the 4x RTX PRO 6000 Workstation (sm120, P2P between all pairs, so
fusion-sm120 applies), the real SGLang 0.5.14 release, real sshd, the stand-in server. ``x`` gets
both runs; ``y`` gets only the run that must remain, in the same gpuops invocation as on ``x`` (so
the same run id is recorded in its desired.json): after undoing the older run on ``x``, x's launch
files must be byte for byte what y has (paths of the host dir aside), its SGLang sources byte for
byte the release's again, and its running server must show the remaining run's flags and
environment only. Then undoing the remaining run leaves ``x`` byte-identical to before both.
A gpuops killed (SIGKILL) in the middle of such a rollback leaves the host as it was before it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from labtools import FUSION_FLASHINFER, launched, tree_hashes
from test_apply_faults import calls, client, journal_events, kill, paused, wait_host_settled

pytestmark = pytest.mark.integration

FAST = ("-e", "gpuops_health_timeout=300", "-e", "gpuops_stop_grace=5")
TREE = '{"nccl_env": {"NCCL_ALGO": "Tree"}}'
LAUNCH_FILES = ("desired.json", "sglang.env", "sglang-launch.sh")


@pytest.fixture(scope="module")
def pair(lab_factory):
    from gpuops.lab.hosts import LabSpec

    return lab_factory(LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.14", count=2, names=("x", "y"),
                               flashinfer=FUSION_FLASHINFER))


def gpuops_json(run_gpuops, *args: str, **kwargs: Any) -> dict[str, Any]:
    proc = run_gpuops(*args, "--json", timeout=500, **kwargs)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(proc.stdout + proc.stderr) from None
    assert proc.returncode == 0, {n: (h["status"], h.get("error"), h.get("log_tail")) for n, h in out["hosts"].items()}
    return out


def launch_files(host, other=None) -> dict[str, bytes | None]:
    """The launch files' bytes, with the host dir and port written as ``other``'s (they are per host)."""
    out: dict[str, bytes | None] = {}
    for name in LAUNCH_FILES:
        path = host.state_dir / name
        data = path.read_bytes() if path.exists() else None
        if data is not None and other is not None:
            data = data.replace(str(host.dir).encode(), str(other.dir).encode())
            data = data.replace(b"--port %d" % host.server_port, b"--port %d" % other.server_port)
        out[name] = data
    return out


def site(host) -> dict[str, str]:
    return tree_hashes(host.dir / "site")


def runs_of(out: dict[str, Any], name: str) -> str:
    return out["hosts"][name]["run_id"]


def test_fusion_then_nccl_env_undo_fusion_first(pair, run_gpuops) -> None:
    inv = str(pair.inventory_path)
    x, y = pair.hosts
    pristine_x, pristine_site = tree_hashes(x.dir, skip_runs=True), site(x)
    assert site(y) == pristine_site  # the same release on both

    fusion = runs_of(gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "x", *FAST), "x")
    assert site(x) != pristine_site
    nccl = runs_of(gpuops_json(run_gpuops, "apply", "nccl-env", "-i", inv, "-l", "x:y", "-e", TREE, *FAST), "x")
    assert launched(x)[0] and launched(x)[1].get("NCCL_ALGO") == "Tree"

    undo = gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x", "--run", fusion)["hosts"]["x"]
    assert undo["status"] == "finished", undo
    assert any("by recomposition" in n for n in undo["notes"]), undo["notes"]
    fused, env = launched(x)
    assert not fused and env.get("NCCL_ALGO") == "Tree", (fused, env)   # nccl-env's part stays
    assert site(x) == pristine_site                                    # fusion's patches gone
    assert launch_files(x, other=y) == launch_files(y)                  # = an apply of nccl-env alone

    history = gpuops_json(run_gpuops, "history", "-i", inv, "-l", "x")["hosts"]["x"]["runs"]
    undid = [r for r in history if r.get("kind") == "rollback" and r.get("target") == fusion]
    assert undid and undid[-1]["outcome"] == "finished" and undid[-1].get("recompose") is True
    by_id = {r["run_id"]: r for r in history}
    assert by_id[fusion]["undone_by"] == undo["run_id"] and "undone_by" not in by_id[nccl]

    # The recomposition is a run like any other: undoing it puts fusion back (patches, flag), NCCL stays.
    redo = gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x", "--run", undo["run_id"])["hosts"]["x"]
    assert redo["status"] == "finished", redo
    assert site(x) != pristine_site and launched(x)[0] and launched(x)[1].get("NCCL_ALGO") == "Tree"
    again = gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x", "--run", fusion)["hosts"]["x"]
    assert again["status"] == "finished" and site(x) == pristine_site and not launched(x)[0]
    assert launch_files(x, other=y) == launch_files(y)

    # The remaining run (the default target now): x is byte-identical to before both.
    last = gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x")["hosts"]["x"]
    assert last["status"] == "finished", last
    assert tree_hashes(x.dir, skip_runs=True) == pristine_x
    assert not launched(x)[0] and "NCCL_ALGO" not in launched(x)[1]
    # y: its one run, the plain way
    gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "y")


def test_nccl_env_then_fusion_undo_nccl_env_first(pair, run_gpuops) -> None:
    inv = str(pair.inventory_path)
    x, y = pair.hosts
    pristine_x, pristine_site = tree_hashes(x.dir, skip_runs=True), site(x)

    nccl = runs_of(gpuops_json(run_gpuops, "apply", "nccl-env", "-i", inv, "-l", "x", "-e", TREE, *FAST), "x")
    gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "x:y", *FAST)
    patched = site(y)
    assert site(x) == patched != pristine_site

    undo = gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x", "--run", nccl)["hosts"]["x"]
    assert undo["status"] == "finished", undo
    fused, env = launched(x)
    assert fused and "NCCL_ALGO" not in env, (fused, env)               # fusion's flag stays
    assert site(x) == patched                                           # and its patches
    assert launch_files(x, other=y) == launch_files(y)                  # = an apply of fusion-sm120 alone

    last = gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x")["hosts"]["x"]
    assert last["status"] == "finished", last
    assert tree_hashes(x.dir, skip_runs=True) == pristine_x
    assert not launched(x)[0]
    gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "y")
    assert site(y) == pristine_site


def test_a_later_patch_of_the_same_source_is_refused_naming_the_run(pair, run_gpuops, tmp_path) -> None:
    """A later run that changed a source the older run patched cannot be recomposed: refused,
    nothing changes, and the message names the runs to roll back first, newest first."""
    inv = str(pair.inventory_path)
    x = pair.hosts[0]
    before_all = tree_hashes(x.dir, skip_runs=True)
    applied = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "x", *FAST)["hosts"]["x"]
    fusion = applied["run_id"]
    patched = next(c["path"] for c in applied["changes"] if c["kind"] == "patch")
    nccl = runs_of(gpuops_json(run_gpuops, "apply", "nccl-env", "-i", inv, "-l", "x", "-e", TREE, *FAST), "x")
    # An operator's own role edits that same source file later.
    role = tmp_path / "roles" / "hotfix"
    role.mkdir(parents=True)
    (role / "tasks.yml").write_text(
        "- name: a later edit of a source fusion-sm120 patched\n  lineinfile:\n    path: \"{{ hotfix_path }}\"\n"
        "    line: \"# hotfix (test)\"\n    regexp: \"^# hotfix\"\n")
    hotfix = runs_of(gpuops_json(run_gpuops, "apply", "hotfix", "-i", inv, "-l", "x", "-e", f"hotfix_path={patched}",
                                 cwd=tmp_path), "x")
    before = tree_hashes(x.dir, skip_runs=True)
    proc = run_gpuops("rollback", "-i", inv, "-l", "x", "--run", fusion, "--json", timeout=300)
    refused = json.loads(proc.stdout)["hosts"]["x"]
    assert proc.returncode == 1 and refused["status"] == "refused", refused
    assert f"{hotfix} (hotfix) changed {patched} again" in refused["error"], refused["error"]
    assert f"roll back {hotfix} (hotfix), {nccl} (nccl-env) first" in refused["error"], refused["error"]
    assert tree_hashes(x.dir, skip_runs=True) == before
    for _ in range(3):   # newest first, as the message says: back to the start
        gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x", cwd=tmp_path)
    assert tree_hashes(x.dir, skip_runs=True) == before_all


def fusion_then_nccl_env(pair, run_gpuops) -> tuple[Any, dict[str, str], str, dict[str, str], tuple[bool, dict[str, str]]]:
    """fusion-sm120, then nccl-env (Tree), applied to host x: (x, its tree before both, fusion's run id,
    its tree with both, what its server runs with both)."""
    inv = str(pair.inventory_path)
    x = pair.hosts[0]
    pristine = tree_hashes(x.dir, skip_runs=True)
    fusion = runs_of(gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "x", *FAST), "x")
    gpuops_json(run_gpuops, "apply", "nccl-env", "-i", inv, "-l", "x", "-e", TREE, *FAST)
    return x, pristine, fusion, tree_hashes(x.dir, skip_runs=True), launched(x)


def test_a_killed_client_during_the_recomposition_leaves_the_host_as_it_was(pair, run_gpuops, gpuops_home) -> None:
    inv = str(pair.inventory_path)
    x, pristine_x, fusion, both, served = fusion_then_nccl_env(pair, run_gpuops)

    (x.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "health", "seconds": 60}))
    earlier = calls(x)
    proc = client(pair, "rollback", "-l", "x", "--run", fusion, home=gpuops_home)
    where = paused(x, "health", proc, earlier)    # the recomposed server is starting
    proc.kill()
    proc.communicate(timeout=120)
    wait_host_settled(x, where)
    assert journal_events(x)[-1][1] == "rolled_back"
    assert tree_hashes(x.dir, skip_runs=True) == both   # fusion's patches and both parts still there
    assert launched(x) == served

    # A later run whose worker and session die (nothing on the host left to notice): the next
    # rollback of the older run rolls that dead run back first, then recomposes.
    (x.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "health", "seconds": 60}))
    earlier = calls(x)
    proc = client(pair, "nccl-env", "-l", "x", "-e", '{"nccl_env": {"NCCL_ALGO": "Ring"}}', *FAST, home=gpuops_home)
    where = paused(x, "health", proc, earlier)
    kill("relay", where, proc)
    proc.kill()
    proc.communicate(timeout=120)
    assert journal_events(x)[-1][1] != "rolled_back"   # the dead run is still open on the host

    # Not a dead end: the same rollback now works, then the last one.
    proc = run_gpuops("rollback", "-i", inv, "-l", "x", "--run", fusion, "--json", "-vv", timeout=500)
    undo = json.loads(proc.stdout)["hosts"]["x"]
    assert undo["status"] == "finished", (undo, proc.stderr[-3000:])
    # Round trips: the helper's rollback mode (it rolls the dead run back, finds later runs standing
    # and sends the journal as it then reads), the launch files' read, the recomposition's
    # transaction: no journal read of its own.
    execs = [line for line in proc.stderr.splitlines() if line.startswith("x: exec ")]
    assert len(execs) == 3, "\n".join(execs)
    assert undo["recovered"] and "had not finished" in undo["recovered"][0], undo
    assert launched(x)[1].get("NCCL_ALGO") == "Tree" and not launched(x)[0]
    gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x")
    assert tree_hashes(x.dir, skip_runs=True) == pristine_x


def test_a_killed_worker_after_the_recomposition_wrote_restores_every_byte(pair, run_gpuops, gpuops_home) -> None:
    """The host-side worker dies (kill -9) once the sources are restored and the launch rewritten:
    the session's helper rolls the recomposition back at once; both runs stand as before."""
    inv = str(pair.inventory_path)
    x, pristine_x, fusion, both, served = fusion_then_nccl_env(pair, run_gpuops)
    (x.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "after_writes", "seconds": 60}))
    earlier = calls(x)
    proc = client(pair, "rollback", "-l", "x", "--run", fusion, "--json", home=gpuops_home)
    where = paused(x, "after_writes", proc, earlier)
    assert tree_hashes(x.dir, skip_runs=True) != both      # the recomposition has written
    kill("worker", where, proc)
    out, _ = proc.communicate(timeout=300)
    wait_host_settled(x, where)
    assert json.loads(out)["hosts"]["x"]["status"] == "rolled_back"
    assert tree_hashes(x.dir, skip_runs=True) == both and launched(x) == served
    for _ in range(2):
        gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x")
    assert tree_hashes(x.dir, skip_runs=True) == pristine_x


def test_a_hand_edit_of_a_patched_source_is_refused_unless_forced(pair, run_gpuops) -> None:
    """The drift check of a plain rollback holds for the files a recomposition restores: a source
    edited by hand since fusion patched it is refused (nothing changes); --force restores it and
    keeps the edited version beside the backups."""
    inv = str(pair.inventory_path)
    x = pair.hosts[0]
    pristine_x = tree_hashes(x.dir, skip_runs=True)
    applied = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "x", *FAST)["hosts"]["x"]
    patched = Path(next(c["path"] for c in applied["changes"] if c["kind"] == "patch"))
    gpuops_json(run_gpuops, "apply", "nccl-env", "-i", inv, "-l", "x", "-e", TREE, *FAST)
    edited = patched.read_bytes() + b"# edited by hand\n"
    patched.write_bytes(edited)
    before = tree_hashes(x.dir, skip_runs=True)
    proc = run_gpuops("rollback", "-i", inv, "-l", "x", "--run", applied["run_id"], "--json", timeout=300)
    refused = json.loads(proc.stdout)["hosts"]["x"]
    assert proc.returncode == 1 and refused["status"] == "refused", refused
    assert f"{patched} changed since run {applied['run_id']} wrote it" in refused["error"] and "--force" in refused["error"]
    assert tree_hashes(x.dir, skip_runs=True) == before
    forced = gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x", "--run", applied["run_id"], "--force")["hosts"]["x"]
    assert forced["status"] == "finished", forced
    kept = next(n for n in forced["notes"] if n.startswith("--force: the later version of"))
    assert Path(kept.split("kept as ")[1].rstrip(")")).read_bytes() == edited
    assert b"# edited by hand" not in patched.read_bytes() and launched(x)[1].get("NCCL_ALGO") == "Tree"
    gpuops_json(run_gpuops, "rollback", "-i", inv, "-l", "x")
    assert tree_hashes(x.dir, skip_runs=True) == pristine_x
