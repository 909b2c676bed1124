"""Rollback puts back files created, modified and re-moded by a run, with faults after the writes.

README: "restores everything (files and the previous server) if any step fails" and `gpuops rollback`
"undo the last run". The run here moves the server's environment file to a new path (a file the run
creates), rewrites the launch script (a file it modifies) and sets its mode (0755 where the host had
0700; the old env file keeps its 0640). What fails comes from outside gpuops' code path: the server
crashes on start-up with the new configuration, after every write. ``tree_hashes`` compares kind,
mode and content of every entry under the host.
"""

from __future__ import annotations

import json

import pytest

from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration


@pytest.fixture
def host_and_lab(lab_factory):
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None)
    host = lab.hosts[0]
    (host.state_dir / "sglang-launch.sh").chmod(0o700)
    (host.state_dir / "sglang.env").chmod(0o640)
    return host, lab


def _apply(run_gpuops, lab, extra: dict) -> dict:
    done = run_gpuops("apply", "sglang-service", "-i", str(lab.inventory_path), "--json", "-e", json.dumps(extra),
                      "-e", "gpuops_health_timeout=30", "-e", "gpuops_stop_grace=5", env={"XDG_STATE_HOME": ""})
    assert done.stdout.strip().startswith("{"), done.stderr
    return {"rc": done.returncode, **json.loads(done.stdout)["hosts"][lab.hosts[0].name]}


def test_a_crash_after_the_writes_restores_created_modified_and_modes(host_and_lab, run_gpuops) -> None:
    host, lab = host_and_lab
    before = tree_hashes(host.dir, skip_runs=True)
    created = host.state_dir / "server.env"
    report = _apply(run_gpuops, lab, {"sglang_env_file": str(created),
                                      "sglang_env": {"GPUOPS_STANDIN_CRASH_IF": "SGLANG_RB_MARK=1", "SGLANG_RB_MARK": "1"}})
    assert report["rc"] == 1 and report["status"] == "rolled_back", report
    # The writes happened before the fault: the run had created and modified these files.
    assert set(report["restored"]) == {str(created), str(host.state_dir / "sglang-launch.sh")}
    assert not created.exists()
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert "SGLANG_RB_MARK" not in json.dumps(server_info(host.server_port))  # the previous server, healthy


def test_rollback_command_undoes_a_finished_run_with_created_files_and_modes(host_and_lab, run_gpuops) -> None:
    host, lab = host_and_lab
    before = tree_hashes(host.dir, skip_runs=True)
    created = host.state_dir / "server.env"
    report = _apply(run_gpuops, lab, {"sglang_env_file": str(created), "sglang_env": {"SGLANG_RB_MARK": "1"}})
    assert report["rc"] == 0 and report["status"] == "finished", report
    assert created.exists() and oct((host.state_dir / "sglang-launch.sh").stat().st_mode & 0o777) == "0o755"
    assert "SGLANG_RB_MARK" in json.dumps(server_info(host.server_port))
    undone = run_gpuops("rollback", "-i", str(lab.inventory_path), env={"XDG_STATE_HOME": ""})
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert "SGLANG_RB_MARK" not in json.dumps(server_info(host.server_port))


def test_a_plain_rollback_is_one_exec_on_the_host(host_and_lab, run_gpuops) -> None:
    """One exec per host per phase: a rollback with nothing later standing on the run's files is the
    helper's rollback mode alone (no journal read before it; it reads the journal itself)."""
    host, lab = host_and_lab
    before = tree_hashes(host.dir, skip_runs=True)
    report = _apply(run_gpuops, lab, {"sglang_env": {"SGLANG_RB_MARK": "1"}})
    assert report["rc"] == 0 and report["status"] == "finished", report
    undone = run_gpuops("rollback", "-i", str(lab.inventory_path), "--json", "-vv", env={"XDG_STATE_HOME": ""})
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert json.loads(undone.stdout)["hosts"][host.name]["status"] == "finished"
    execs = [line for line in undone.stderr.splitlines() if line.startswith(f"{host.name}: exec ")]
    assert len(execs) == 1, "\n".join(execs)
    assert tree_hashes(host.dir, skip_runs=True) == before


def test_a_symlinked_managed_file_stays_a_link_to_the_same_bytes(lab_factory, run_gpuops) -> None:
    # An operator keeps the env file elsewhere and links it into place. Whatever gpuops does with
    # the link (refuse it, or write through it and restore), a failed run leaves link and target
    # as they were: never a regular file where the link was.
    import os

    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None)
    host = lab.hosts[0]
    target = host.dir / "conf" / "sglang.env"
    target.parent.mkdir()
    os.replace(host.state_dir / "sglang.env", target)
    (host.state_dir / "sglang.env").symlink_to(target)
    before = tree_hashes(host.dir, skip_runs=True)
    report = _apply(run_gpuops, lab, {"sglang_env": {"GPUOPS_STANDIN_CRASH_IF": "SGLANG_RB_MARK=1",
                                                     "SGLANG_RB_MARK": "1"}})
    assert report["rc"] == 1 and report["ok"] is False, report
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert (host.state_dir / "sglang.env").is_symlink()


@pytest.mark.parametrize("undo", ["crash", "rollback"])
def test_an_env_file_under_two_new_directories_leaves_no_directory_behind(host_and_lab, run_gpuops, undo: str) -> None:
    """The run creates ``state/conf/env/`` for the env file it moves; the run's own rollback (the
    server crashes) and `gpuops rollback` both take the two directories away again."""
    host, lab = host_and_lab
    before = tree_hashes(host.dir, skip_runs=True)
    created = host.state_dir / "conf" / "env" / "server.env"
    env = {"SGLANG_RB_MARK": "1"}
    if undo == "crash":
        env["GPUOPS_STANDIN_CRASH_IF"] = "SGLANG_RB_MARK=1"
    report = _apply(run_gpuops, lab, {"sglang_env_file": str(created), "sglang_env": env})
    if undo == "crash":
        assert report["rc"] == 1 and report["status"] == "rolled_back", report
    else:
        assert report["rc"] == 0 and report["status"] == "finished" and created.exists(), report
        undone = run_gpuops("rollback", "-i", str(lab.inventory_path), env={"XDG_STATE_HOME": ""})
        assert undone.returncode == 0, undone.stdout + undone.stderr
    assert not (host.state_dir / "conf").exists()
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert "SGLANG_RB_MARK" not in json.dumps(server_info(host.server_port))
