"""Shared fixtures for the whole suite (unit and integration).

``lab_factory`` (session scope)
    ``lab_factory(*specs: LabSpec, **spec_fields) -> gpuops.lab.hosts.Lab``: starts simulated GPU
    hosts (real OpenSSH sshd on 127.0.0.1, replaying nvidia-smi, real SGLang source, stand-in
    server) in a fresh temp directory. With no specs, ``LabSpec(**spec_fields)`` is used, e.g.
    ``lab_factory(gpu="h200-x1", sglang=None, server=False, count=2)``. Every lab it started is
    stopped at the end of the session, even when tests fail; a test may also ``lab.stop()`` early.
    The returned ``Lab`` has ``hosts`` (``LabHost``: name, port, dir, state_dir, site_dir,
    server_port), ``inventory_path``, ``known_hosts``, ``ssh_config``, ``ssh_command(host, cmd)``.
    A lab is shared by the tests that hold it: a test that changes a host (apply, restart) should
    start its own.

``run_gpuops`` (function scope)
    ``run_gpuops(*args, input=None, env=None, cwd=None, timeout=180) -> CompletedProcess[str]``:
    runs ``python -m gpuops.cli ARGS`` in a subprocess with ``HOME`` set to a temp dir (so the
    user's real ~/.ssh is never read or written), ``SSH_AUTH_SOCK`` removed, the SGLang release
    cache kept (``GPUOPS_CACHE``), and ``cwd`` defaulting to a temp dir. ``env`` adds variables.
    ``run_gpuops.forked([ARGS, ...], env=None, cwd=None, timeout=180) -> [CompletedProcess]``: the
    same, each command in a process forked from one that imported gpuops once
    (``labtools.gpuops_cli_forked``): for many commands whose words and exit status are the test.

``gpuops_home`` (function scope)
    The temp HOME that ``run_gpuops`` uses in this test (holds an empty ``.ssh/``).

``fixtures_dir``
    ``Path`` of the test data, ``tests/fixtures`` (``GPUOPS_FIXTURES`` overrides); the same lookup
    as tests/unit/facts_fixtures.py (``labtools.fixtures_path``).

Bytecode (automatic)
    Under ``PYTHONDONTWRITEBYTECODE`` every pytest process (each xdist worker too) would rewrite and
    compile the ~300 test modules, and every child Python (each ``gpuops`` command) compile gpuops,
    from source each time. The pytest processes keep their bytecode under the user's cache across
    runs (``PYCACHE``), the children theirs in the session's temp dir (files run by path from temp
    dirs go with it); never in the source tree.

Parallel workers (README's test command: ``-n 4 --dist loadfile``, pytest-xdist)
    Each test file runs whole in one worker, so a module's labs start once; the files under
    ``tests/integration/managers`` run in ONE worker together (``pytest_xdist_make_scheduler`` in
    ``tests/work_order.py``), so a run boots one private dockerd and imports the Debian root into it
    once, not once per worker; the longest work units (timed by the runs before) are handed out
    first, so none is left running alone at the end. Each worker has its own temp dir (``tmp_path_factory``); ports come from
    ``gpuops.lab.ports`` (the kernel's, never fixed); the release caches under ``~/.cache/gpuops``
    are filled under a file lock and finished by an atomic rename.

Skip policy (README, "Testing")
    A skipped test fails the run unless its reason is on ``ALLOWED_SKIPS`` below: a green run must
    mean every promise was checked. Every skip and its reason is printed at the end of the run,
    allowed or not, so README's test command and CI enforce the same thing.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from gpuops.errors import GpuopsError
from gpuops.lab.sglang_cache import cache_root

# tests/labtools.py (host fingerprints, the server's view) is importable as `labtools`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from labtools import fixtures_path, run_cli  # (needs the path above)

# The order parallel workers are handed their work units in: the longest first (tests/work_order.py).
pytest_plugins = ("work_order",)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return fixtures_path()


@pytest.fixture(scope="session")
def lab_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    from gpuops.lab.hosts import Lab, LabSpec, start_lab, stop_lab

    labs: list[Lab] = []

    def make(*specs: LabSpec, **spec_fields: Any) -> Lab:
        if specs and spec_fields:
            raise TypeError("lab_factory: give LabSpec objects or LabSpec fields, not both")
        chosen = list(specs) or [LabSpec(**spec_fields)]
        root = tmp_path_factory.mktemp("lab")
        lab = start_lab(root / "lab", chosen)
        labs.append(lab)
        return lab

    try:
        yield make
    finally:
        for lab in labs:
            try:
                stop_lab(lab.root)
            except GpuopsError:
                pass  # already stopped and removed by the test


# A run started in the background by a shell without job control (`nohup ... &`, a CI runner's
# script) inherits SIGINT ignored, and so would every `gpuops` it starts: a program started with
# SIGINT ignored rightly keeps ignoring it (that is how shells keep background jobs out of the
# terminal's Ctrl-C), so the tests that press Ctrl-C on a command would see nothing happen. A
# handler of our own is not inherited across exec: each command starts as it would in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Bytecode of this pytest process, kept under the user's cache (never the source tree; a .pyc there
# is checked against its source's mtime and size and written by an atomic rename, so concurrent runs
# share it; one given in PYTHONPYCACHEPREFIX, as benchmarks/promise_mutants gives its copies, is
# kept). Under PYTHONDONTWRITEBYTECODE (this project's machine sets it) each pytest process rewrote
# and compiled every test module again: collecting the suite took 13.4 CPU-s a process that way and
# 3.7 with the bytecode kept, and README's command starts 4 of them.
PYCACHE = Path(os.environ.get("PYTHONPYCACHEPREFIX") or cache_root().parent / "pycache")
if os.environ.get("PYTHONDONTWRITEBYTECODE"):
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(PYCACHE)


# Bytecode of the Pythons the suite starts, kept across runs beside the pytest processes' own: with a
# prefix of their own, children never read the __pycache__ beside a module (site-packages', the
# standard library's), so a prefix new each session compiled, in every worker, all that its children
# import: measured cold vs kept, `import torch.distributed` 5.3 vs 2.4 CPU-s, matplotlib and numpy
# 2.3 vs 0.8, `gpuops results list` 0.8 vs 0.13.
CHILD_PYCACHE = cache_root().parent / "pycache-children"


@pytest.fixture(scope="session", autouse=True)
def _child_bytecode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite starts a few thousand Pythons (every ``gpuops`` command, helpers run by path):
    under ``PYTHONDONTWRITEBYTECODE`` each of them compiled gpuops' ~100 modules from source again
    (~0.2 s of CPU a command). They keep their bytecode in ``CHILD_PYCACHE`` instead
    (``PYTHONPYCACHEPREFIX``), across runs and workers (a .pyc is checked against its source's
    mtime and size and written by an atomic rename); what mirrors this session's temp dir (the lab's
    files run by path from temp dirs) is removed at its end, so it does not pile up run after run.
    A prefix given by the caller (benchmarks/promise_mutants: one per copy) keeps the old way: one
    of this session's temp dir."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        yield
        return
    given = bool(os.environ.get("PYTHONPYCACHEPREFIX"))
    prefix = tmp_path_factory.mktemp("pycache") if given else CHILD_PYCACHE
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONDONTWRITEBYTECODE")
        patch.setenv("PYTHONPYCACHEPREFIX", str(prefix))
        yield
    if not given:
        # the whole run's temp root (an xdist worker's own dir is a child of it, beside the run's
        # shared one): a worker that ends first only makes another recompile a lab file or two
        base = tmp_path_factory.getbasetemp()
        root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        shutil.rmtree(CHILD_PYCACHE / root.relative_to("/"), ignore_errors=True)
        _prune_stale_temp_bytecode(CHILD_PYCACHE / "tmp")


def _prune_stale_temp_bytecode(mirror: Path, days: float = 1.0) -> None:
    """Bytecode of files imported from other temp dirs (a session killed before its end, a command's
    own mkdtemp) untouched for ``days``: removed (two levels: /tmp/X and /tmp/pytest-of-USER/X)."""
    cutoff = time.time() - days * 86400
    try:
        tops = list(mirror.iterdir())
    except OSError:
        return
    for top in tops:
        entries = list(top.iterdir()) if top.name.startswith("pytest-of-") and top.is_dir() else [top]
        for entry in entries:
            try:
                stale = entry.stat().st_mtime < cutoff
            except OSError:
                continue
            if stale:
                shutil.rmtree(entry, ignore_errors=True)


@pytest.fixture
def gpuops_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir(mode=0o700)
    return home


@pytest.fixture
def run_gpuops(gpuops_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., subprocess.CompletedProcess]:
    from gpuops.lab.sglang_cache import cache_root

    default_cwd = tmp_path_factory.mktemp("cwd")

    def full_env(env: dict[str, str] | None) -> dict[str, str]:
        full = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "GPUOPS_LAB_DIR")}
        full["HOME"] = str(gpuops_home)
        full.setdefault("GPUOPS_CACHE", str(cache_root().parent))
        full.update(env or {})
        return full

    def run(
        *args: str,
        input: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float = 180,
    ) -> subprocess.CompletedProcess:
        return run_cli(list(args), input=input, env=full_env(env), cwd=cwd or default_cwd, timeout=timeout)

    def forked(
        commands: list[tuple[str, ...]],
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float = 180,
    ) -> list[subprocess.CompletedProcess]:
        from labtools import gpuops_cli_forked

        return gpuops_cli_forked(commands, cwd=cwd or default_cwd, env=full_env(env), timeout=timeout)

    run.forked = forked  # type: ignore[attr-defined]
    return run


# -- where the suite's CPU goes (issue 39) ------------------------------------------------------

# `GPUOPS_TEST_CPU=DIR`: each test's wall time and CPU seconds (this process, and the children it
# reaped meanwhile: every `gpuops` command, helper and lab host process it waited for) appended as
# one JSON line to DIR/<worker>.jsonl (with the wall-clock time it ended, for a per-worker timeline);
# `benchmarks/suite_cpu DIR` sums them per module. Daemons a
# test leaves to a later teardown are counted there (a module's lab: its last test's teardown).
CPU_DIR_ENV = "GPUOPS_TEST_CPU"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = os.environ.get(CPU_DIR_ENV)
    if not folder:
        yield
        return
    wall, cpu = time.monotonic(), _cpu_seconds()
    yield
    row = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3), "cpu_s": round(_cpu_seconds() - cpu, 3),
           "end": round(time.time(), 3)}
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")


# -- skip policy ---------------------------------------------------------------------------------

# (pattern of the skip reason, why this absence is acceptable). Short on purpose: anything else that
# skips fails the run, because a skip there would hide a broken promise behind a green run.
ALLOWED_SKIPS: tuple[tuple[str, str], ...] = (
    (r"^no python3\.\d+ interpreter",
     "an old Python for a compatibility check is not installed (searched PATH and pyenv)"),
    (r"^no python with torch",
     "torch is optional: scripts/setup-env tries to install it, the all-reduce suite needs it"),
    (r"^no GPU", "a check that needs a real GPU, on a machine without one"),
    (r"^needs root to boot containers",
     "systemd-nspawn, overlay mounts and a private dockerd need root (CI runs as root)"),
)

_skips: list[tuple[str, str]] = []


def skip_allowed(reason: str) -> bool:
    return any(re.search(pattern, reason) for pattern, _ in ALLOWED_SKIPS)


def _skip_reason(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skips.append((report.nodeid, _skip_reason(report)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == 0 and any(not skip_allowed(reason) for _, reason in _skips):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _skips:
        return
    terminalreporter.section("skips (policy: tests/conftest.py ALLOWED_SKIPS)")
    bad = 0
    for nodeid, reason in _skips:
        allowed = skip_allowed(reason)
        bad += not allowed
        terminalreporter.line(f"{'allowed' if allowed else 'NOT ALLOWED'}: {nodeid}: {reason}")
    if bad:
        terminalreporter.line(f"{bad} skip(s) for a reason not on the allow-list: the run fails", red=True)
