"""gpuops apply / rollback / history over real sshd lab hosts with the stand-in server (process manager).

Every test that changes a host starts its own lab host (a few hundred ms). The fusion role, which
needs real SGLang releases, is in test_apply_fusion.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration

def pid_of(host) -> int:
    return int((host.state_dir / "sglang.pid").read_text())


def host_journal(host) -> list[dict[str, Any]]:
    path = host.state_dir / "journal.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def apply(run_gpuops, lab, *args: str) -> subprocess.CompletedProcess:
    return run_gpuops("apply", *args, "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=30",
                      "-e", "gpuops_stop_grace=5", env={"XDG_STATE_HOME": ""})


@pytest.fixture
def lab(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang=None)


def test_check_mode_changes_nothing_and_shows_diffs(lab, run_gpuops) -> None:
    host = lab.hosts[0]
    before = tree_hashes(host.dir)
    pid = pid_of(host)
    proc = apply(run_gpuops, lab, "nccl-env", "--check", "--diff", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 8}}')
    assert proc.returncode == 0, proc.stderr
    assert "+NCCL_MIN_NCHANNELS='8'" in proc.stdout
    assert "would run handler: restart sglang" in proc.stdout
    # sglang.env and desired.json (its composed part); ok= counts the role's tasks, which grow
    assert re.search(r"h01 : ok=\d+ changed=2 failed=0", proc.stdout), proc.stdout
    assert tree_hashes(host.dir) == before
    assert not (host.state_dir / "journal.jsonl").exists() and not (host.state_dir / "runs").exists()
    assert pid_of(host) == pid


def test_apply_restarts_with_the_new_env_then_rerun_is_a_noop(lab, run_gpuops, gpuops_home) -> None:
    host = lab.hosts[0]
    extra = '{"nccl_env": {"NCCL_MIN_NCHANNELS": 8, "NCCL_P2P_LEVEL": "PHB"}}'
    proc = apply(run_gpuops, lab, "nccl-env", "--json", "-e", extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["h01"]
    assert report["ok"] and report["status"] == "finished" and report["changed"] >= 1
    assert report["run_id"] and report["handlers"] == ["restart sglang"]
    assert {c["path"] for c in report["changes"]} >= {str(host.state_dir / "sglang.env")}
    assert all("after_sha256" in c and "diff" in c and "after" not in c for c in report["changes"])
    env = server_info(host.server_port)["env"] if "env" in server_info(host.server_port) else server_info(host.server_port)
    assert "NCCL_MIN_NCHANNELS" in json.dumps(env) and "PHB" in json.dumps(env)
    pid = pid_of(host)
    assert report["pid"] == pid

    again = apply(run_gpuops, lab, "nccl-env", "--json", "-e", extra)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)["hosts"]["h01"]
    assert second["changed"] == 0 and second["changes"] == [] and second["status"] == "unchanged"
    assert pid_of(host) == pid  # not restarted

    history = run_gpuops("history", "-i", str(lab.inventory_path), "--json")
    runs = json.loads(history.stdout)["hosts"]["h01"]["runs"]
    assert [r["outcome"] for r in runs] == ["finished"]   # a no-op run leaves the host untouched
    assert runs[0]["role"] == "nccl-env" and runs[0]["changed"] == report["changed"]
    home = [json.loads(l) for l in (gpuops_home / ".local/state/gpuops/journal.jsonl").read_text().splitlines()]
    assert [(r["host"], r["outcome"]) for r in home] == [("h01", "finished"), ("h01", "unchanged")]
    assert home[0]["changes"][0]["after_sha256"] and "NCCL" not in json.dumps(home)  # hashes, no contents


def test_rollback_restores_every_byte(lab, run_gpuops) -> None:
    host = lab.hosts[0]
    before = tree_hashes(host.dir, skip_runs=True)
    assert apply(run_gpuops, lab, "nccl-env", "-e", '{"nccl_env": {"NCCL_BUFFSIZE": 8388608}}').returncode == 0
    assert tree_hashes(host.dir, skip_runs=True) != before
    proc = run_gpuops("rollback", "-i", str(lab.inventory_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert "NCCL_BUFFSIZE" not in json.dumps(server_info(host.server_port))
    history = json.loads(run_gpuops("history", "-i", str(lab.inventory_path), "--json").stdout)
    kinds = [(r.get("kind"), r["outcome"]) for r in history["hosts"]["h01"]["runs"]]
    assert kinds == [(None, "finished"), ("rollback", "finished")]


def test_startup_crash_is_rolled_back(lab, run_gpuops) -> None:
    host = lab.hosts[0]
    before = tree_hashes(host.dir, skip_runs=True)
    extra = '{"nccl_env": {"NCCL_ALGO": "Tree"}, "sglang_env": {"GPUOPS_STANDIN_CRASH_IF": "NCCL_ALGO=Tree"}}'
    proc = apply(run_gpuops, lab, "nccl-env", "-e", extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "CUDA graph capture" in proc.stdout                  # the field warning, before the run
    assert "the server exited during start-up" in proc.stdout
    assert "NCCL_ALGO=Tree is not supported" in proc.stdout      # the server's own log line
    assert "rolled back" in proc.stdout and "failed=1" in proc.stdout
    assert tree_hashes(host.dir, skip_runs=True) == before
    info = server_info(host.server_port)                          # the previous config, healthy
    assert "NCCL_ALGO" not in json.dumps(info)
    assert [r["event"] for r in host_journal(host)] == ["started", "server_touched", "previous_started", "rolled_back"]
    # Nothing is left unfinished: the next apply is not refused.
    assert apply(run_gpuops, lab, "nccl-env", "--check").returncode == 0


def test_bad_nccl_name_is_refused_before_anything(lab, run_gpuops) -> None:
    host = lab.hosts[0]
    before = tree_hashes(host.dir)
    proc = apply(run_gpuops, lab, "nccl-env", "-e", '{"nccl_env": {"NCCL_ALGOS": "Ring"}}')
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "did you mean NCCL_ALGO?" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_hashes(host.dir) == before


def test_hostile_values_stay_inert(lab, run_gpuops, tmp_path: Path) -> None:
    host = lab.hosts[0]
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    hostile = f"$(touch {marker})"
    extra = json.dumps({"sglang_env": {"SGLANG_NOTE": hostile, "SGLANG_TICKS": f"`touch {marker}`; touch {marker}"},
                        "sglang_args": ["--model-path", "/models/x", "--served-model-name", hostile,
                                        "--port", str(host.server_port)]})
    proc = apply(run_gpuops, lab, "sglang-service", "-e", extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists()
    env_text = (host.state_dir / "sglang.env").read_text()
    assert f"SGLANG_NOTE='{hostile}'" in env_text
    info = json.dumps(server_info(host.server_port))
    assert json.dumps(hostile)[1:-1] in info          # literally in the server's environment and flags
    assert not marker.exists()


def _start_client(lab, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK",)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpuops.cli", "apply", "nccl-env", "-i", str(lab.inventory_path),
         "-e", "gpuops_health_timeout=60", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _wait_for_restart(host, client: subprocess.Popen) -> Path:
    """The transaction folder of the apply whose restart is under way on the host."""
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline and client.poll() is None, client.communicate()
        calls = host.state_dir / "calls"
        for progress in calls.glob("*/progress.jsonl") if calls.exists() else ():
            if '"phase": "health"' in progress.read_text():
                return progress.parent
        time.sleep(0.05)


def _wait_for_result(call_dir: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while not (call_dir / "result.json").exists():
        assert time.monotonic() < deadline, (call_dir / "progress.jsonl").read_text()
        time.sleep(0.1)
    return json.loads((call_dir / "result.json").read_text())


def test_concurrent_apply_is_refused(lab, run_gpuops) -> None:
    host = lab.hosts[0]
    # The first apply's server takes 30 s to come up: long enough for a second apply to collide.
    first = _start_client(lab, "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 4}, "sglang_env": {"GPUOPS_STANDIN_STARTUP_S": "30"}}')
    try:
        call_dir = _wait_for_restart(host, first)
        second = apply(run_gpuops, lab, "nccl-env", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 2}}')
        assert second.returncode == 1
        assert "another gpuops run holds the host lock" in second.stdout
    finally:
        first.send_signal(signal.SIGKILL)  # and let the host roll itself back (the fault matrix tests more)
        first.wait(timeout=10)
    assert _wait_for_result(call_dir)["status"] == "rolled_back"
    assert "NCCL_MIN_NCHANNELS='2'" not in (host.state_dir / "sglang.env").read_text()


def test_several_hosts_in_parallel_and_limit(lab_factory, run_gpuops) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, count=3)
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "-l", "h01:h03", "--forks", "4",
                      "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 8}}', "-e", "gpuops_health_timeout=30")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recap = proc.stdout.split("RECAP", 1)[1]
    assert re.search(r"h01 : ok=\d+ changed=", recap) and re.search(r"h03 : ok=\d+ changed=", recap)
    assert "h02" not in recap
    assert "NCCL_MIN_NCHANNELS='8'" in (lab.host("h03").state_dir / "sglang.env").read_text()
    assert "NCCL_MIN_NCHANNELS" not in (lab.host("h02").state_dir / "sglang.env").read_text()
    for name in ("h01", "h03"):
        assert "NCCL_MIN_NCHANNELS" in json.dumps(server_info(lab.host(name).server_port))


def test_become_runs_through_sudo_with_the_password_on_stdin(lab, run_gpuops) -> None:
    host = lab.hosts[0]
    sudo = host.bin_dir / "sudo"          # first on the lab host's PATH: a sudo that checks the password
    sudo.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "--" ]; do\n'
        '  if [ "$1" = "-S" ]; then IFS= read -r pw; [ "$pw" = hunter2-pw ] || { echo "sudo: wrong password" >&2; exit 1; }; fi\n'
        "  shift\n"
        "done\n"
        'shift; exec "$@"\n'
    )
    sudo.chmod(0o755)
    proc = run_gpuops("apply", "nccl-env", "--become", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=30",
                      "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 2}}', env={"GPUOPS_BECOME_PASS": "hunter2-pw"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NCCL_MIN_NCHANNELS='2'" in (host.state_dir / "sglang.env").read_text()
    assert "hunter2-pw" not in proc.stdout + proc.stderr + (host.state_dir / "journal.jsonl").read_text()
    wrong = run_gpuops("apply", "nccl-env", "--become", "-i", str(lab.inventory_path),
                       "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 4}}', env={"GPUOPS_BECOME_PASS": "nope"})
    assert wrong.returncode == 1 and "NCCL_MIN_NCHANNELS='2'" in (host.state_dir / "sglang.env").read_text()
    assert "nope" not in wrong.stdout + wrong.stderr


def test_secrets_never_reach_output_or_journals(lab, run_gpuops, gpuops_home) -> None:
    host = lab.hosts[0]
    token, password = "hf_live_0123456789abcdef", "p4ssw0rd-value-xyz"
    extra = json.dumps({"sglang_env": {"HF_TOKEN": token, "SGLANG_DB_PASSWORD": password}})
    check = apply(run_gpuops, lab, "sglang-service", "--check", "--diff", "-e", extra)
    assert check.returncode == 0 and "HF_TOKEN='<masked:" in check.stdout
    proc = apply(run_gpuops, lab, "sglang-service", "--diff", "--json", "-e", extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env_text = (host.state_dir / "sglang.env").read_text()
    assert f"HF_TOKEN='{token}'" in env_text                            # the host gets the value
    assert oct((host.state_dir / "sglang.env").stat().st_mode & 0o777) == "0o600"
    seen = check.stdout + check.stderr + proc.stdout + proc.stderr
    seen += (host.state_dir / "journal.jsonl").read_text()
    seen += (gpuops_home / ".local/state/gpuops/journal.jsonl").read_text()
    seen += run_gpuops("history", "-i", str(lab.inventory_path), "--json").stdout
    assert token not in seen and password not in seen


def test_failed_port_move_is_rolled_back_to_the_old_port(lab, run_gpuops) -> None:
    import socket

    import yaml

    host = lab.hosts[0]
    before = tree_hashes(host.dir, skip_runs=True)
    args = yaml.safe_load(lab.inventory_path.read_text())["all"]["children"]["lab"]["hosts"]["h01"]["sglang_args"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        new_port = probe.getsockname()[1]
    moved = [str(new_port) if a == str(host.server_port) else a for a in args]
    extra = json.dumps({"sglang_args": moved, "sglang_port": new_port,
                        "sglang_env": {"GPUOPS_STANDIN_CRASH_IF": "SGLANG_CRASH=1", "SGLANG_CRASH": "1"}})
    proc = apply(run_gpuops, lab, "sglang-service", "--json", "-e", extra)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)["hosts"]["h01"]
    assert report["status"] == "rolled_back", report
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert server_info(host.server_port)                    # healthy again, where it listened before
