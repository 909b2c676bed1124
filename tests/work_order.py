"""The order in which README's parallel run hands out its work units: the longest first (issue 39).

With ``--dist loadfile`` a test module (or ``tests/integration/managers/`` as one unit: conftest's
``SHARED_DAEMON_TESTS``) runs whole on one worker, handed out in collection order. In collection
order the longest units often started last and ran alone at the end while the other workers had
nothing left; handing the longest out first (longest-processing-time-first scheduling) fills that
tail with the short ones. The lengths come from the runs before: each run adds its units' wall
seconds (setup + call + teardown of their tests) to ``DURATIONS`` in the user's cache; a machine
with none yet reads the committed ``SEED`` (written the same way by a whole run on the project's
2-core machine). Within a unit the order is pytest's own (the sort is stable), so fixtures scoped
to a module or a class keep their tests together.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from gpuops.lab.sglang_cache import cache_root

# Test files that share session fixtures too expensive to start once per worker (a private dockerd
# with the Debian root imported and the lab images built, the booted systemd root): one work unit.
SHARED_DAEMON_TESTS = "tests/integration/managers/"
DURATIONS = cache_root().parent / "test-durations.json"
SEED = Path(__file__).resolve().parent / "durations.json"
# A unit no run has timed yet (a new module): about a typical integration module.
UNKNOWN_S = 30.0

_seconds: dict[str, float] = defaultdict(float)
_ORDER = pytest.StashKey[dict]()
_role = {"worker": False}


def work_unit(nodeid: str) -> str:
    return SHARED_DAEMON_TESTS if nodeid.startswith(SHARED_DAEMON_TESTS) else nodeid.split("::")[0]


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def known_durations() -> dict[str, float]:
    """The committed seed, overlaid by what this machine's runs measured since."""
    return {**_read(SEED), **_read(DURATIONS)}


def pytest_configure(config: pytest.Config) -> None:
    # xdist's own reordering (by number of tests) would undo ours: a module of 300 one-line tests
    # is not a long one.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # One reading for the whole run: the controller's, handed to its workers (they must collect
    # in the same order, and another run may rewrite the file meanwhile).
    worker_input = getattr(config, "workerinput", None)
    config.stash[_ORDER] = worker_input["gpuops_durations"] if worker_input else known_durations()
    # A worker is told by its workerinput, not by $PYTEST_XDIST_WORKER: a pytest run inside a test
    # (tests/unit/test_parallel_workers.py) inherits that variable from the worker it runs in.
    _role["worker"] = worker_input is not None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput["gpuops_durations"] = node.config.stash[_ORDER]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering for fixtures of wider scope
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    durations = config.stash[_ORDER]
    if durations:
        items.sort(key=lambda item: -durations.get(work_unit(item.nodeid), UNKNOWN_S))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _role["worker"]:  # the controller (or a run without workers) hears every report
        _seconds[work_unit(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _role["worker"] or not _seconds:
        return
    merged = {**known_durations(), **{unit: round(s, 1) for unit, s in _seconds.items()}}
    try:
        DURATIONS.parent.mkdir(parents=True, exist_ok=True)
        partial = DURATIONS.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
        os.replace(partial, DURATIONS)
    except OSError:
        pass  # a read-only cache costs the order of the next run, nothing else


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with ``SHARED_DAEMON_TESTS`` as one unit (tryfirst: xdist's own hook
    would answer first otherwise). Other ``--dist`` modes are xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedDaemonsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED_DAEMON_TESTS if nodeid.startswith(SHARED_DAEMON_TESTS) else super()._split_scope(nodeid)

    return SharedDaemonsTogether(config, log)
