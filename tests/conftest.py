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

``gpuops_home`` (function scope)
    The temp HOME that ``run_gpuops`` uses in this test (holds an empty ``.ssh/``).

``fixtures_dir``
    ``/work/shared/fixtures``-style data: ``Path`` of the shared fixtures (``GPUOPS_FIXTURES`` overrides).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from gpuops.errors import GpuopsError

# tests/labtools.py (host fingerprints, the server's view) is importable as `labtools`.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _fixtures_path() -> Path:
    env = os.environ.get("GPUOPS_FIXTURES")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" / "fixtures"
        if candidate.is_dir():
            return candidate
    return Path("/work/shared/fixtures")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return _fixtures_path()


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


@pytest.fixture
def gpuops_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir(mode=0o700)
    return home


@pytest.fixture
def run_gpuops(gpuops_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., subprocess.CompletedProcess]:
    from gpuops.lab.sglang_cache import cache_root

    default_cwd = tmp_path_factory.mktemp("cwd")

    def run(
        *args: str,
        input: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float = 180,
    ) -> subprocess.CompletedProcess:
        full_env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "GPUOPS_LAB_DIR")}
        full_env["HOME"] = str(gpuops_home)
        full_env.setdefault("GPUOPS_CACHE", str(cache_root().parent))
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "gpuops.cli", *args],
            input=input,
            capture_output=True,
            text=True,
            env=full_env,
            cwd=str(cwd or default_cwd),
            timeout=timeout,
        )

    return run
