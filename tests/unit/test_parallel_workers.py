"""README's test command in parallel workers (pytest-xdist, ``-n N --dist loadfile``): the suite's
own conftest keeps its promises there. A throwaway tree shaped like ``tests/`` (the real conftest
copied in) runs under pytest in a subprocess, as CI runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# Each throwaway test records the worker it ran in, one file per test file.
RECORD = "import os, pathlib\n\ndef test_where():\n    pathlib.Path(__file__).with_suffix('.worker').write_text(os.environ['PYTEST_XDIST_WORKER'])\n"


def run_tree(root: Path, files: dict[str, str], *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "labtools.py", "work_order.py"):  # the conftest and what it imports
        (root / "tests").mkdir(exist_ok=True)
        shutil.copy(TESTS / name, root / "tests" / name)
    (root / "pytest.ini").write_text("[pytest]\n")
    for relative, body in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, "tests"],
                          capture_output=True, text=True, cwd=root, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "GPUOPS_TEST_CPU"},  # its rows are not the suite's
                               "GPUOPS_CACHE": str(root / "cache"), **(env or {})})


def test_the_managers_files_share_one_worker_and_the_others_spread(tmp_path: Path) -> None:
    """One dockerd and one booted root a run: every file under tests/integration/managers lands in
    one worker. Without the conftest's scheduler, loadfile gives the first two files to two workers."""
    files = {f"tests/integration/managers/test_m{i}.py": RECORD for i in range(3)}
    files.update({f"tests/unit/test_u{i}.py": RECORD for i in range(3)})
    done = run_tree(tmp_path, files, "-n", "2", "--dist", "loadfile")
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {path: (tmp_path / path).with_suffix(".worker").read_text() for path in files}
    managers = {workers[p] for p in files if "/managers/" in p}
    assert len(managers) == 1, workers
    assert len(set(workers.values())) == 2, workers  # the other files still go to both workers


def test_unlisted_skips_fail_a_parallel_run_too(tmp_path: Path) -> None:
    """The skip policy judges the workers' reports in the controller: a skip for an unlisted reason
    in a worker fails the run and is printed, as in a run without workers."""
    body = "import pytest\n\ndef test_loaded():\n    pytest.skip('machine too loaded')\n\ndef test_ok():\n    pass\n"
    done = run_tree(tmp_path, {"tests/unit/test_throwaway.py": body}, "-n", "2", "--dist", "loadfile")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT ALLOWED: tests/unit/test_throwaway.py::test_loaded: machine too loaded" in done.stdout
    assert "1 skip(s) for a reason not on the allow-list: the run fails" in done.stdout


def test_the_longest_work_unit_is_handed_out_first_and_each_run_times_its_units(tmp_path: Path) -> None:
    """tests/work_order.py: the units the runs before timed longest start first (here the last file
    collected), and the run adds what it measured to the user's cache for the next one."""
    stamp = "import os, pathlib, time\n\ndef test_when():\n    pathlib.Path(__file__).with_suffix('.start').write_text(str(time.monotonic_ns()))\n"
    files = {f"tests/unit/test_u{i}.py": stamp for i in range(3)}
    cache = tmp_path / "cache"  # $GPUOPS_CACHE: the user's cache of gpuops
    cache.mkdir()
    (cache / "test-durations.json").write_text(json.dumps({"tests/unit/test_u2.py": 500, "tests/unit/test_u0.py": 1}))
    done = run_tree(tmp_path, files, "-n", "1", "--dist", "loadfile", env={"GPUOPS_CACHE": str(cache)})
    assert done.returncode == 0, done.stdout + done.stderr
    started = sorted(files, key=lambda p: int((tmp_path / p).with_suffix(".start").read_text()))
    assert started == ["tests/unit/test_u2.py", "tests/unit/test_u1.py", "tests/unit/test_u0.py"]  # 500, unknown (30), 1
    timed = json.loads((cache / "test-durations.json").read_text())
    assert set(timed) >= set(files) and timed["tests/unit/test_u2.py"] < 500, timed  # measured now, not the old figure
