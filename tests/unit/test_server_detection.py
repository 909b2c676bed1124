"""One rule for "is this process an SGLang server" (``remote/sglang_argv.py::is_server_argv``):
inspect's gather (its awk ``gpuops_is_server``) and the process service manager (``_is_server``,
which apply asks whether the server it started still runs) agree with it on every form, recorded
from real processes (``tests/fixtures/recorded/server-argv.json`` and live, ``tests/server_forms.py``)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuops.facts.python_select import _FUNCTIONS
from gpuops.remote import process_manager
from gpuops.remote.sglang_argv import is_server_argv
from gpuops.remote.sglang_server import find_server_pid, process_cmdline

from server_forms import forms, make_package, recorded_argv  # tests/ is on the path (conftest.py)

CASES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "server-argv.json").read_text())["cases"]


def gather_says_server(argv: list[str]) -> bool:
    """The gather's own sh function, fed the argv one word a line as it reads /proc/PID/cmdline."""
    done = subprocess.run(["/bin/sh", "-c", _FUNCTIONS + '\nprintf "%s\\n" "$@" | gpuops_is_server', "sh", *argv],
                          capture_output=True, timeout=30)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


@pytest.mark.parametrize("case", CASES, ids=[c["form"] for c in CASES])
def test_every_recorded_form_is_judged_alike_by_inspect_and_the_rule(case: dict) -> None:
    assert is_server_argv(case["argv"]) is case["server"], case
    assert gather_says_server(case["argv"]) is case["server"], case


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_package(tmp_path_factory.mktemp("sglang-standin"))


def test_live_processes_in_every_form_are_judged_by_their_real_cmdline(standin: dict[str, str]) -> None:
    for name, argv, expected in forms(standin):
        seen = recorded_argv(argv, standin["root"])
        assert seen, name
        assert is_server_argv(seen) is expected, (name, seen)
        assert gather_says_server(seen) is expected, (name, seen)


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_given_no_port_is_the_default_ports_not_every_urls() -> None:
    """bench reads the environment of the server it finds for its URL (its PYTHONPATH decides which
    stack is recorded): a server given no --port listens on SGLang's 30000, so it must not be taken
    for the one on another port. (A CI run recorded the wrong stack when another test's server ran.)"""
    sleep = [sys.executable, "-c", "import time; time.sleep(120)", "-m", "sglang.launch_server", "--model-path", "m"]
    ours_port, nobodys_port = _unused_port(), _unused_port()
    unported = subprocess.Popen(sleep)  # started first: the lower pid, met first in /proc
    ours = subprocess.Popen(sleep + ["--port", str(ours_port)])
    try:
        for proc in (unported, ours):  # the argv is in /proc once the exec is done
            deadline = time.monotonic() + 30
            while "sglang.launch_server" not in (process_cmdline(proc.pid) or []) and time.monotonic() < deadline:
                time.sleep(0.01)
        assert find_server_pid(f"http://127.0.0.1:{ours_port}") == ours.pid
        assert find_server_pid(f"http://127.0.0.1:{nobodys_port}") not in (unported.pid, ours.pid)
        assert find_server_pid("http://127.0.0.1:30000") is not None  # the unported one, or another on 30000
    finally:
        for proc in (unported, ours):
            proc.kill()
            proc.wait()


def test_a_launch_script_counts_by_its_name_before_it_execs(standin: dict[str, str]) -> None:
    argv = ["/bin/sh", standin["run_script"]]
    assert not is_server_argv(argv)
    assert is_server_argv(argv, scripts=("run-sglang.sh",)) and is_server_argv(argv, scripts=(standin["run_script"],))


def test_a_server_started_as_sglang_serve_runs_for_the_process_manager(standin: dict[str, str], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """apply's process manager starts the launch script, then asks status() whether the server runs
    (apply_service.wait_healthy): a server launched by SGLang's console script must not read as
    "exited during start-up"."""
    from gpuops.lab.ports import free_port

    port = free_port()
    state = tmp_path / "state"
    state.mkdir()
    (state / process_manager.LAUNCH_SCRIPT).write_text(f"exec {standin['script']} serve --model-path /m --port {port}\n")
    monkeypatch.setenv("PYTHONPATH", standin["root"])
    monkeypatch.setenv("GPUOPS_FORM_HEALTH_PORT", str(port))
    started = process_manager.start(str(state), port=port, health_timeout=60)
    try:
        assert started["ok"] and started["healthy"], started
        status = process_manager.status(str(state), port)
        assert status["running"] and status["healthy"] and status["pid"] == started["pid"], status
    finally:
        process_manager.stop(str(state), grace=5)
    assert not process_manager.status(str(state))["running"]


def test_apply_does_not_declare_a_sglang_serve_server_exited_during_start_up(standin: dict[str, str], tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The apply helper's own service steps (remote/apply_service.py, process manager): start, the
    health wait that asks "is the server I started still running" every quarter second, the port
    ownership and the launch check, for a server launched by SGLang's console script."""
    from gpuops.lab.ports import free_port
    from gpuops.remote.apply_lease import NoLease
    from gpuops.remote.apply_run import Run

    port = free_port()
    state = tmp_path / "state"
    state.mkdir()
    (state / process_manager.LAUNCH_SCRIPT).write_text(f"exec {standin['script']} serve --model-path /m --port {port}\n")
    monkeypatch.setenv("PYTHONPATH", standin["root"])
    monkeypatch.setenv("GPUOPS_FORM_HEALTH_PORT", str(port))
    payload = {"state_dir": str(state), "run_id": "r1", "meta": {},
               "service": {"manager": "process", "state_dir": str(state), "port": port, "grace": 5, "health_timeout": 60}}
    service = Run(payload, lambda event: None, NoLease()).service
    service.start()
    try:
        # The route the stand-in answered depends on the release it follows (/model_info from 0.5.16 on,
        # /get_model_info before); either is a healthy answer from the server that was started.
        assert service.wait_healthy(NoLease()) in ("/model_info", "/get_model_info", "/server_info", "/get_server_info")
        assert service.running()[0]
    finally:
        service.stop()
    assert service.running() == (False, None)
