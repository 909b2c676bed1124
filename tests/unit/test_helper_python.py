"""The command that runs a helper on a host says, in one line, when it has no python to run on
(``shipping.NO_PYTHON``), and the client names it (``shipping.missing_python``): a gpuops_python that
is not there, none on PATH, one too old (real Python 2.7 and 3.7 interpreters, found on this
machine). Before, a Python 2.7 died on the helper's syntax with a traceback, and the client read
the closed channel as "connection lost, outcome unknown" (issue 42)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from labtools import require_python

from gpuops.shipping import NO_PYTHON_STATUS, missing_python, python_command, python_stdin


def _run(command: str, env: dict[str, str] | None = None, stream: bool = False) -> subprocess.CompletedProcess:
    body = python_stdin("print('ran')", is_source=True, stream=stream)
    return subprocess.run(["/bin/sh", "-c", command], input=body, capture_output=True, timeout=60, env=env)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_a_gpuops_python_that_is_not_there_is_named(tmp_path, stream: bool) -> None:
    done = _run(python_command(str(tmp_path / "nope" / "python3"), stream=stream), stream=stream)
    assert done.returncode == NO_PYTHON_STATUS and done.stdout == b""
    assert missing_python(done.stderr.decode()) == (
        f"no python: gpuops_python {tmp_path / 'nope' / 'python3'} (or ansible_python_interpreter) is not an "
        "executable on this host")


def test_no_python_on_path_is_named(tmp_path) -> None:
    done = _run(python_command(None), env={"PATH": str(tmp_path)})  # sh's builtins only: no python anywhere
    assert done.returncode == NO_PYTHON_STATUS
    assert missing_python(done.stderr.decode()) == (
        "no python: no python3 (nor python) on this host's PATH; set gpuops_python to a python 3.8+")


@pytest.mark.parametrize("version", ["2.7", "3.7"])
@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_a_python_older_than_3_8_says_so_before_it_reads_the_helper(version: str, stream: bool) -> None:
    old = require_python(version)
    done = _run(python_command(old, stream=stream), stream=stream)
    assert done.returncode == NO_PYTHON_STATUS and b"Traceback" not in done.stderr, done.stderr
    why = missing_python(done.stderr.decode())
    assert why is not None and why.startswith(f"no python: {old} is Python {version}."), done.stderr
    assert why.endswith("gpuops needs 3.8+ (set gpuops_python to one)")


@pytest.mark.parametrize("version", ["3.8"])
def test_3_8_runs_the_helper(version: str) -> None:
    done = _run(python_command(require_python(version)))
    assert done.returncode == 0 and done.stdout == b"ran\n", done.stderr


def test_a_helper_that_ran_and_failed_is_not_a_missing_python() -> None:
    assert missing_python("Traceback (most recent call last):\nValueError: x\n") is None
    assert missing_python("cannot parse output: ValueError: gpuops: no python: no python3 on this host") == \
        "no python: no python3 on this host"


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_a_helper_starts_without_the_site_module(tmp_path, stream: bool) -> None:
    """Helpers are stdlib-only: their python starts with -S, so a host's sitecustomize, .pth files and
    site-packages cost them nothing (and run nothing in them); PYTHONPATH still counts."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.stderr.write('sitecustomize ran\\n')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    body = python_stdin("import sys\nprint('ran', 'site' in sys.modules, %r in sys.path)" % str(tmp_path),
                        is_source=True, stream=stream)
    done = subprocess.run(["/bin/sh", "-c", python_command(sys.executable, stream=stream)], input=body,
                          capture_output=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"ran", b"False", b"True"] and b"sitecustomize ran" not in done.stderr
