"""The tests' forking runner (``labtools.CliZygote``) answers as ``python -m gpuops.cli`` does: the
same exit status, stdout and stderr, in the command's own cwd and environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from labtools import CliZygote, run_cli


def _fresh(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuops.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_forked_commands_answer_as_a_fresh_interpreter_does(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path))
    assert CliZygote.for_env(env) is not None  # this environment is forked, not started afresh
    (tmp_path / "here").touch()  # a file, in the command's cwd only: refused there, "no results" elsewhere
    for args in (["--version"], ["no-such-command"], ["results", "list", "--results-dir", "here"]):
        forked, fresh = run_cli(args, env=env, cwd=tmp_path), _fresh(args, env, tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr), args
    assert run_cli(["no-such-command"], env=env, cwd=tmp_path).returncode == 2
    assert "is a file" in run_cli(["results", "list", "--results-dir", "here"], env=env, cwd=tmp_path).stderr


def test_an_environment_python_reads_at_start_up_gets_a_fresh_interpreter(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path))
    assert CliZygote.for_env(env) is not None
    assert CliZygote.for_env(dict(env, PYTHONIOENCODING="latin-1")) is None
