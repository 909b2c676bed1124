"""Every benchmark script still runs (issue 39, "Benchmarks cannot rot").

Each script under benchmarks/ runs once with ``--smoke`` (benchmarks/README.md, "Smoke mode"): one
round of the smallest sizes, no warm-up, no assertion on any figure, through the very code a real
run takes (its own lab hosts, the gpuops commands, the raw-ssh floors, ansible-playbook of the [test]
extra), so a change that breaks a script fails CI instead of being found by the next person who
needs the figures. The GPU recipes under benchmarks/device/ get what a CPU can check: ``bash -n``
for shell scripts, compiling for Python files.

Nothing is installed: a smoke run never makes the bench venv (57 s on a fresh machine). pyinfra is
in no extra, so inspect_overhead generates and compiles its pyinfra deploy but does not run it here
(the script says so in its output).

The scripts run three at a time, started when the first of these tests asks: much of a lab
script's time is waiting (ssh round trips, a stand-in's restart and health checks), so three
overlap in about half the time one after the other took on the 2-core machine. Each test then
waits for its own script and reports that script's own wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

pytestmark = pytest.mark.integration

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# script -> extra arguments besides --smoke ({out}: the script's own temp dir). Writing --json (and
# --markdown) is part of what a real run does, so the smoke runs write them too. Longest first:
# the pool starts them in this order.
SCRIPTS: dict[str, tuple[str, ...]] = {
    "speed_targets": ("--json", "{out}/speed.json", "--markdown", "{out}/phases.md"),
    "apply_overhead": ("--json", "{out}/apply.json"),
    "inspect_overhead": ("--json", "{out}/inspect.json"),
    "phase_profile": ("--json", "{out}/phases.json", "--markdown", "{out}/phases.md"),
    "gate_accuracy": ("--json", "{out}/accuracy.json"),
    "promise_mutants": ("--python", sys.executable, "--json", "{out}/mutants.json"),
    "connection_reuse": ("--json", "{out}/reuse.json"),
    "gate_sample": (),
    "help_startup": ("--json", "{out}/help.json"),
    "summarize": (),
    "suite_cpu": (),
}
AT_ONCE = 3
# The JSON these write is read back by benchmarks/summarize, its reader.
SUMMARIZED = {"inspect_overhead", "apply_overhead"}
NOT_SCRIPTS = {"benchlib.py", "README.md"}


@pytest.fixture(scope="module")
def smoke_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """As run_gpuops runs gpuops: a temp HOME (the user's ~/.ssh is never read; the bench venv, if a
    user made one, is not found, so what runs is what CI has), no ssh agent, the release cache kept.
    The session's PYTHONPYCACHEPREFIX (conftest) stays: the scripts share its bytecode."""
    from gpuops.lab.sglang_cache import cache_root

    home = tmp_path_factory.mktemp("bench-home")
    (home / ".ssh").mkdir(mode=0o700)
    drop = ("SSH_AUTH_SOCK", "GPUOPS_LAB_DIR", "GPUOPS_BENCH_VENV", "GPUOPS_KEEP", "GPUOPS_SSH_CONTROL_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["HOME"] = str(home)
    env.setdefault("GPUOPS_CACHE", str(cache_root().parent))
    return env


# A hang guard, not a speed check: speed_targets' smoke (gpuops, raw ssh and ansible-playbook, one
# round each) took 109 s on a quiet CI run and ran past 280 s at load 13 beside three other workers.
SMOKE_LIMIT_S = 900


def run_script(name: str, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=SMOKE_LIMIT_S, stdin=subprocess.DEVNULL)


class Smoke:
    """One script's smoke run: its arguments, its temp dir, and (when done) its outcome and wall time."""

    def __init__(self, name: str, out: Path, env: dict[str, str]) -> None:
        self.name, self.out, self.env = name, out, env
        self.args = [a.format(out=out) for a in SCRIPTS[name]]
        self.seconds = 0.0

    def __call__(self) -> subprocess.CompletedProcess:
        started = time.monotonic()
        try:
            return run_script(self.name, ["--smoke", *self.args], self.env, self.out)
        finally:
            self.seconds = time.monotonic() - started


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest, smoke_env: dict[str, str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Smoke, Future]]]:
    """Every script this session smoke-runs, started AT_ONCE at a time when the first test asks.
    Under pytest-xdist each worker would start them all: there, each script runs when asked."""
    wanted = [item.callspec.params["name"] for item in request.session.items
              if getattr(item, "originalname", "") == "test_benchmark_script_still_runs"]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        wanted = []
    runs: dict[str, tuple[Smoke, Future]] = {}
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        def start(name: str) -> tuple[Smoke, Future]:
            smoke = Smoke(name, tmp_path_factory.mktemp(f"smoke-{name}"), smoke_env)
            return smoke, pool.submit(smoke)

        for name in sorted(set(wanted), key=list(SCRIPTS).index):
            runs[name] = start(name)

        class Runs(dict):
            def __missing__(self, name: str) -> tuple[Smoke, Future]:
                self[name] = start(name)
                return self[name]

        yield Runs(runs)


def tail(done: subprocess.CompletedProcess, lines: int = 40) -> str:
    return "\n".join((done.stdout + "\n" + done.stderr).strip().splitlines()[-lines:])


def test_every_benchmark_script_has_a_smoke_run() -> None:
    """A new script under benchmarks/ is smoke-run here too (or the next one rots unseen)."""
    found = {p.name for p in BENCHMARKS.iterdir() if p.is_file() and p.name not in NOT_SCRIPTS}
    assert found == set(SCRIPTS), f"add to SCRIPTS: {sorted(found - set(SCRIPTS))}; gone: {sorted(set(SCRIPTS) - found)}"


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_benchmark_script_still_runs(name: str, smoke_runs: dict[str, tuple[Smoke, Future]]) -> None:
    """This benchmark script still runs: `benchmarks/<name> --smoke` exits 0 (one round, no figures
    judged), and the result files it was asked for are written and parse."""
    smoke, future = smoke_runs[name]
    done = future.result()
    print(f"benchmarks/{name} --smoke: {smoke.seconds:.1f} s wall")
    assert done.returncode == 0, f"benchmarks/{name} --smoke exited {done.returncode}:\n{tail(done)}"
    written = [Path(a) for a in smoke.args if a.startswith(str(smoke.out))]
    for path in written:
        assert path.is_file() and path.stat().st_size > 0, f"benchmarks/{name} --smoke did not write {path.name}"
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
    if name in SUMMARIZED:
        again = run_script("summarize", [str(p) for p in written], smoke.env, smoke.out)
        assert again.returncode == 0, f"benchmarks/summarize cannot read what {name} writes:\n{tail(again)}"


def _device_files() -> list[Any]:
    files = sorted(p for p in (BENCHMARKS / "device").rglob("*") if p.is_file())
    return [pytest.param(p, id=str(p.relative_to(BENCHMARKS))) for p in files
            if p.suffix in (".sh", ".py") or p.read_bytes()[:2] == b"#!"]


@pytest.mark.parametrize("path", _device_files())
def test_device_script_still_parses(path: Path) -> None:
    """This device benchmark script still parses (it needs a GPU to run, so CI checks what a CPU can):
    shell by `bash -n`, Python compiled (nothing written beside it)."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    if path.suffix == ".sh" or (first.startswith("#!") and ("bash" in first or first.endswith("sh"))):
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"bash -n {path}: {done.stderr}"
    else:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
