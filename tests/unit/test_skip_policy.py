"""The skip policy itself (tests/conftest.py): a skip for an unlisted reason fails the run, loudly.

The suite's own conftest is copied beside a throwaway test file and pytest runs there, as README's
command would: the exit status and the printed reasons are what CI sees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def run_pytest(tmp_path: Path, body: str, *options: str) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "labtools.py", "work_order.py"):  # the conftest and what it imports
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_throwaway.py").write_text("import pytest\n\n" + body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "GPUOPS_TEST_CPU"},  # its rows are not the suite's
                               "GPUOPS_CACHE": str(tmp_path / "cache")})  # its timings stay here


def test_unlisted_skips_and_xfails_fail_the_run_allowed_ones_are_printed(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, (
        "def test_ok():\n    pass\n\n"
        "def test_loaded():\n    pytest.skip('machine too loaded')\n\n"
        "@pytest.mark.xfail(reason='flaky')\ndef test_x():\n    assert False\n\n"
        "def test_old():\n    pytest.skip('no python3.7 interpreter (searched PATH and pyenv)')\n"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT ALLOWED: test_throwaway.py::test_loaded: machine too loaded" in done.stdout
    assert "NOT ALLOWED: test_throwaway.py::test_x: xfail: flaky" in done.stdout
    assert "allowed: test_throwaway.py::test_old: no python3.7 interpreter" in done.stdout
    assert "2 skip(s) for a reason not on the allow-list: the run fails" in done.stdout


def test_allowed_skips_alone_pass(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "def test_old():\n    pytest.skip('no python3.7 interpreter (searched PATH and pyenv)')\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "allowed: test_throwaway.py::test_old: no python3.7 interpreter" in done.stdout
