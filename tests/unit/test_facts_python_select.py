"""The preamble, run by /bin/sh here against real processes: server by port, python choice, quoting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.errors import GpuopsError
from gpuops.facts.python_select import preamble, preamble_for_vars, sglang_port
from gpuops.inventory import Host

SLEEPER = "import time; time.sleep(120)"


def _run(vars: dict, tail: str = "") -> dict[str, str]:
    script = preamble_for_vars(vars) + "\n" + (
        'echo "pid=$GPUOPS_SERVER_PID"\necho "others=$GPUOPS_SERVER_OTHERS"\necho "py=$GPUOPS_PY"\n'
        'echo "why=$GPUOPS_PY_REASON"\necho "pythonpath=${PYTHONPATH:-}"\n' + tail
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["/bin/sh", "-s"], input=script, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@pytest.fixture
def spawn() -> Iterator:
    started: list[subprocess.Popen] = []

    def start(argv: list[str], env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _wait_for_argv(pid: int, word: str) -> None:
    # exec of the child may lag behind Popen returning
    for _ in range(3000):  # up to 30 s: a loaded CI box starts pythons slowly
        try:
            if word.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never showed {word!r}")


def _port() -> int:
    # The OS hands out ephemeral ports in sequence, so ports from successive calls differ (random
    # ones could repeat a fake server's port still sleeping from an earlier test).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fake_server(spawn, port: int, env: dict | None = None) -> subprocess.Popen:
    proc = spawn([sys.executable, "-c", SLEEPER, "-m", "sglang.launch_server", "--model-path", "/m", "--port", str(port)], env)
    _wait_for_argv(proc.pid, "launch_server")
    return proc


def test_the_server_on_the_wanted_port_is_chosen_among_several(spawn) -> None:
    a, b = _port(), _port() + 1
    server_a = _fake_server(spawn, a)
    server_b = _fake_server(spawn, b, env=dict(os.environ, PYTHONPATH="/opt/sglang-site"))
    out = _run({"sglang_port": b})
    assert out["pid"] == str(server_b.pid)
    assert f"{server_a.pid}:{a}" in out["others"].split()
    # its interpreter (argv[0] is absolute here) and its PYTHONPATH are what probes will use
    assert out["py"] == sys.executable
    assert "running SGLang server's interpreter" in out["why"]
    assert out["pythonpath"] == "/opt/sglang-site"


def test_no_server_on_the_port_means_none_even_if_others_run(spawn) -> None:
    a = _port()
    other = _fake_server(spawn, a)
    out = _run({"sglang_port": a + 7})
    assert out["pid"] == ""
    assert f"{other.pid}:{a}" in out["others"].split()
    assert out["why"].endswith("on PATH")


def test_equals_form_of_port_flag(spawn) -> None:
    port = _port()
    proc = spawn([sys.executable, "-c", SLEEPER, "-m", "sglang.launch_server", f"--port={port}"])
    _wait_for_argv(proc.pid, "launch_server")
    assert _run({"sglang_port": port})["pid"] == str(proc.pid)


def test_a_shell_wrapper_loses_to_the_python_it_started(spawn, tmp_path: Path) -> None:
    port = _port()
    wrapper = tmp_path / "wrapper.sh"
    # not exec: the sh process and its python child both carry the launch words
    wrapper.write_text(f'#!/bin/sh\n{sys.executable} -c "$GPUOPS_T_CODE" "$@"\n')
    wrapper.chmod(0o755)
    sh = spawn([str(wrapper), "-m", "sglang.launch_server", "--port", str(port)], env=dict(os.environ, GPUOPS_T_CODE=SLEEPER))
    _wait_for_argv(sh.pid, "launch_server")
    children: list[str] = []
    for _ in range(3000):  # up to 30 s: a loaded CI box starts pythons slowly
        children = subprocess.run(["pgrep", "-P", str(sh.pid)], capture_output=True, text=True).stdout.split()
        # until its exec, the child is a copy of the sh wrapper, argv and all
        if children and "python" in os.path.basename(os.readlink(f"/proc/{children[0]}/exe")):
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the wrapper's python never started")
    _wait_for_argv(int(children[0]), "launch_server")
    assert _run({"sglang_port": port})["pid"] == children[0]


def test_sglang_python_wrapper_that_is_not_python_falls_back(tmp_path: Path) -> None:
    fake = tmp_path / "not-python"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    out = _run({"sglang_port": _port(), "sglang_python": str(fake)})
    assert out["py"] != str(fake) and out["py"]
    assert f"sglang_python {fake} is not a python >= 3.8" in out["why"]


def test_sglang_python_wrapper_that_runs_python_is_used(tmp_path: Path) -> None:
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    out = _run({"sglang_port": _port(), "sglang_python": str(wrapper)})
    assert out["py"] == str(wrapper)
    assert out["why"] == "host var sglang_python"


def test_hostile_values_are_quoted(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker}); touch {marker}; `touch {marker}`"
    out = _run({"sglang_port": _port(), "sglang_python": hostile, "gpuops_python": f"'; touch {marker}; '"})
    assert not marker.exists()
    assert out["py"]  # fell back to a real python


def test_port_must_be_a_port() -> None:
    assert sglang_port({}) == 30000
    assert sglang_port({"sglang_port": "31000"}) == 31000
    for bad in ("30000; rm -rf /", 0, 70000, True, "x"):
        with pytest.raises(GpuopsError, match="sglang_port"):
            sglang_port({"sglang_port": bad})
    host = Host(name="gpu1", address=None, port=None, user=None, key_file=None, connection="ssh", groups=(),
                vars={"sglang_port": "nope"})
    with pytest.raises(GpuopsError, match="^gpu1: sglang_port"):
        preamble(host)


def test_multiline_python_var_is_refused() -> None:
    with pytest.raises(GpuopsError, match="sglang_python"):
        preamble_for_vars({"sglang_python": "/usr/bin/python3\nrm -rf /"})


def test_a_python_older_than_38_is_not_chosen() -> None:
    from labtools import require_python

    old = Path(require_python("3.7"))
    out = _run({"sglang_port": _port(), "sglang_python": str(old)})
    assert out["py"] != str(old)
    assert f"sglang_python {old} is not a python >= 3.8" in out["why"]


def test_sglang_serve_forms_are_servers(spawn, tmp_path: Path) -> None:
    # Three ports from the OS, not port + 1 and + 2, which nothing reserves: in a whole run (2026-12-03)
    # another process of the suite had port + 2 and was found as that port's server (pid 31556).
    port, module_port, other_port = _port(), _port(), _port()
    script = tmp_path / "sglang"  # a console script named like SGLang's
    script.write_text(f"#!{sys.executable}\nimport time; time.sleep(120)\n")
    script.chmod(0o755)
    console = spawn([str(script), "serve", "--port", str(port)])
    _wait_for_argv(console.pid, "serve")
    assert _run({"sglang_port": port})["pid"] == str(console.pid)
    module = spawn([sys.executable, "-c", SLEEPER, "-m", "sglang.cli.main", "serve", "--port", str(module_port)])
    _wait_for_argv(module.pid, "serve")
    assert _run({"sglang_port": module_port})["pid"] == str(module.pid)
    # a word "serve" after anything else is not a server
    other = spawn([sys.executable, "-c", SLEEPER, "notsglang", "serve", "--port", str(other_port)])
    _wait_for_argv(other.pid, "serve")
    assert _run({"sglang_port": other_port})["pid"] == ""


def test_a_gpuops_python_that_is_not_there_is_named_although_another_python_was_chosen(spawn, tmp_path: Path) -> None:
    """Issue 42: the server's python is chosen for the probes, but apply, rollback and history run
    their helpers with gpuops_python: one that is not on the host is named (and becomes inspect's
    warning, facts/host.py); one that is there is not."""
    from gpuops.facts.python_select import GPUOPS_PYTHON_MISSING

    port = _port()
    _fake_server(spawn, port)
    missing = tmp_path / "nope" / "python3"
    out = _run({"sglang_port": port, "gpuops_python": str(missing)})
    assert out["py"] == sys.executable and out["why"].startswith("the running SGLang server's interpreter")
    assert f"gpuops_python {missing} {GPUOPS_PYTHON_MISSING}" in out["why"]
    there = _run({"sglang_port": port, "gpuops_python": sys.executable})
    assert GPUOPS_PYTHON_MISSING not in there["why"]
    assert GPUOPS_PYTHON_MISSING in _run({"sglang_port": _port(), "gpuops_python": str(missing)})["why"]  # no server too
