"""gpuops/remote/process_manager.py with real processes and real HTTP servers (no SSH needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuops.lab import launch_files, sshd
from gpuops.remote import process_manager
from labtools import require_python

pytestmark = pytest.mark.integration

# A tiny server: /health answers 200; with IGNORE_TERM it shrugs off SIGTERM.
TINY_SERVER = """
import http.server, os, signal, sys
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
print("tiny server on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def make_state(tmp_path: Path, env: dict[str, str] | None = None, crash: bool = False) -> tuple[Path, int]:
    state = tmp_path / "state"
    state.mkdir()
    server = tmp_path / "tiny_server.py"
    server.write_text("import sys; print('boom: bad flag', flush=True); sys.exit(3)\n" if crash else TINY_SERVER)
    # A python wrapper named like the lab's: `-m sglang.launch_server` runs the tiny server.
    wrapper = tmp_path / "python-sglang"
    wrapper.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {server} -m sglang.launch_server "$@"\n')
    wrapper.chmod(0o755)
    port = sshd.free_port()
    launch_files.write_launch_files(state, "h01", str(wrapper), ["--port", str(port)], env or {}, port)
    return state, port


def cli(*args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, process_manager.__file__, *args], capture_output=True, text=True, timeout=60
    )
    return done.returncode, json.loads(done.stdout)


def test_start_status_stop_through_the_cli(tmp_path) -> None:
    state, port = make_state(tmp_path)
    rc, started = cli("start", "--state-dir", str(state), "--port", str(port), "--health-timeout", "30")
    assert rc == 0 and started["running"] and started["healthy"] and started["started"]
    pid = started["pid"]
    assert (state / "sglang.pid").read_text().strip() == str(pid)
    # Detached: its own session, not the CLI's; still alive after the CLI exited.
    assert os.getsid(pid) == pid
    assert "sglang.launch_server" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    rc, again = cli("start", "--state-dir", str(state), "--port", str(port))
    assert rc == 0 and again["started"] is False and again["pid"] == pid
    assert cli("status", "--state-dir", str(state), "--port", str(port))[1] == {
        "running": True, "pid": pid, "healthy": True, "ok": True}
    rc, stopped = cli("stop", "--state-dir", str(state))
    assert rc == 0 and stopped["stopped"] and stopped["signal"] == "SIGTERM"
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    assert not (state / "sglang.pid").exists()
    log = (state / "sglang.log").read_text()
    assert log.startswith("=== gpuops process_manager: start ") and f"tiny server on {port}" in log
    assert cli("status", "--state-dir", str(state), "--port", str(port))[1]["running"] is False


def test_stop_kills_a_server_that_ignores_sigterm_after_the_grace(tmp_path) -> None:
    state, port = make_state(tmp_path, env={"IGNORE_TERM": "1"})
    started = process_manager.start(str(state), port=port, health_timeout=30)
    assert started["healthy"], started
    began = time.monotonic()
    stopped = process_manager.stop(str(state), grace=1.0)
    assert stopped["stopped"] and stopped["signal"] == "SIGKILL"
    assert time.monotonic() - began >= 1.0  # it waited the grace before killing
    assert process_manager.status(str(state), port) == {"running": False, "pid": None, "healthy": False, "ok": True}


def test_a_server_dying_at_start_up_is_reported_with_its_log(tmp_path) -> None:
    state, port = make_state(tmp_path, crash=True)
    rc, result = cli("start", "--state-dir", str(state), "--port", str(port), "--health-timeout", "20")
    assert rc == 1 and result["ok"] is False and result["running"] is False
    assert "exited during start-up" in result["error"]
    assert any("boom: bad flag" in line for line in result["log_tail"])


def test_a_reused_pid_is_not_taken_for_the_server(tmp_path) -> None:
    state, port = make_state(tmp_path)
    # The pid file points at a live process that is not a server (here: a sleep of ours).
    other = subprocess.Popen(["sleep", "30"])
    try:
        (state / "sglang.pid").write_text(f"{other.pid}\n")
        assert process_manager.status(str(state))["running"] is False
        result = process_manager.stop(str(state), grace=1)
        assert result["stopped"] is False and other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()


def test_restart_gives_a_new_healthy_process_and_payload_mode(tmp_path) -> None:
    state, port = make_state(tmp_path)
    first = process_manager.start(str(state), port=port, health_timeout=30)
    from gpuops import shipping

    payload = {"action": "restart", "state_dir": str(state), "port": port, "grace": 5, "health_timeout": 30}
    done = subprocess.run(
        ["/bin/sh", "-c", shipping.python_command(sys.executable)],
        input=shipping.python_stdin("process_manager", payload),
        capture_output=True,
        timeout=60,
    )
    result = json.loads(done.stdout)
    try:
        assert done.returncode == 0 and result["healthy"] and result["pid"] != first["pid"]
    finally:
        process_manager.stop(str(state), grace=2)


def test_missing_launch_script_is_a_clear_failure(tmp_path) -> None:
    result = process_manager.start(str(tmp_path), port=1, health_timeout=1)
    assert result["ok"] is False and "sglang-launch.sh: no such file" in result["error"]


def test_runs_under_python38(tmp_path) -> None:
    py38 = require_python("3.8")
    state, port = make_state(tmp_path)
    from gpuops import shipping

    def run(action: str) -> dict:
        # As it reaches a host: bundled with the host modules it imports, on stdin of that python.
        payload = {"action": action, "state_dir": str(state), "port": port, "grace": 5, "health_timeout": 60}
        done = subprocess.run(["/bin/sh", "-c", shipping.python_command(py38)],
                              input=shipping.python_stdin("process_manager", payload), capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert run("start")["healthy"] is True
    assert run("status")["running"] is True
    assert run("stop")["stopped"] is True
