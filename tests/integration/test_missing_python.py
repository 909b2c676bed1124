"""A host without python3, or a gpuops_python that is not there, is one line naming it on every
command, and nothing changes (issue 42). Before, apply, rollback and history said "the connection
to the host was lost ... outcome unknown", and advise ranked fusion-sm120 "apply now" while every
other line said it could not tell.

Real lab hosts (real sshd): ``gpuops_python`` pointed at a path that does not exist, and a host
whose sessions' PATH holds every command of this machine but python (its sshd reloaded with that
PATH, its server stopped, no interpreter named in the inventory).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from labtools import tree_hashes

pytestmark = pytest.mark.integration

MISSING = "/nonexistent/python3"
NAMED = f"no python: gpuops_python {MISSING} (or ansible_python_interpreter) is not an executable on this host"
NONE_FOUND = "no python: no python >= 3.8 found (server, sglang_python, python3, python)"
NOT_SAID = ("outcome unknown", "connection to the host was lost", "Traceback", "rolls itself back")


@pytest.fixture(scope="module")
def lab(lab_factory):
    from gpuops.lab.hosts import LabSpec

    return lab_factory(LabSpec(names=("m1",), count=1, sglang=None))


def _inventory(lab, tmp_path: Path, **changes) -> Path:
    """The lab's inventory with the host's variables changed (None: removed)."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    host = data["all"]["children"]["lab"]["hosts"]["m1"]
    for name, value in changes.items():
        if value is None:
            host.pop(name, None)
        else:
            host[name] = value
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def _said_once(done: subprocess.CompletedProcess, line: str) -> None:
    text = done.stdout + done.stderr
    assert line in text, text[-3000:]
    assert "m1" in text
    for word in NOT_SAID:
        assert word not in text, text[-3000:]


COMMANDS = {
    "apply": ["apply", "nccl-env", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "7"}}'],
    "rollback": ["rollback"],
    "history": ["history"],
    "bench": ["bench", "--remote", "--suite", "decode", "--num-requests", "2", "--warmup", "0"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_gpuops_python_that_is_not_there_is_named(lab, run_gpuops, tmp_path, command) -> None:
    host = lab.hosts[0]
    inventory = _inventory(lab, tmp_path, gpuops_python=MISSING)
    before = tree_hashes(host.dir, skip_runs=True)
    results = ["--results-dir", str(tmp_path / "results")] if command == "bench" else []
    done = run_gpuops(*COMMANDS[command], "-i", str(inventory), *results, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    _said_once(done, NAMED)
    assert tree_hashes(host.dir, skip_runs=True) == before


def test_inspect_and_advise_name_a_gpuops_python_that_is_not_there(lab, run_gpuops, tmp_path) -> None:
    """inspect probes with the server's python, and names the gpuops_python the other commands need;
    advise says it beside the commands it advises."""
    inventory = _inventory(lab, tmp_path, gpuops_python=MISSING)
    done = run_gpuops("inspect", "host", "-i", str(inventory), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"warning: gpuops_python {MISSING} is not on this host: apply, rollback and history cannot run" \
        in done.stdout, done.stdout[-3000:]
    advised = run_gpuops("advise", "-i", str(inventory), timeout=300)
    assert f"note: gpuops_python {MISSING} is not on this host" in advised.stdout, advised.stdout[-3000:]


# ---------------------------------------------------------------- a host with no python at all


def _without_python(lab, tmp_path_factory) -> None:
    """The host's sessions get a PATH of links to every command here but python; sshd reloads."""
    host = lab.hosts[0]
    bin_dir = tmp_path_factory.mktemp("no-python-bin")
    for directory in ("/usr/bin", "/bin"):
        for entry in os.scandir(directory):
            if not re.match(r"(python|pydoc)", entry.name) and not (bin_dir / entry.name).exists():
                (bin_dir / entry.name).symlink_to(entry.path)
    config = host.dir / "sshd_config"
    text = config.read_text()
    config.write_text(re.sub(r"(?<![A-Z_])PATH=[^ \"]+", f"PATH={host.dir / 'bin'}:{bin_dir}", text, count=1))
    os.kill(host.sshd_pid, signal.SIGHUP)  # sshd re-reads its config for the next sessions
    pid = int((host.state_dir / "sglang.pid").read_text())
    os.kill(pid, signal.SIGTERM)  # no server: its interpreter cannot be borrowed
    give_up = time.monotonic() + 60
    while True:
        probe = subprocess.run(["ssh", "-F", str(lab.root / "ssh_config"), "m1", "command -v python3 || echo none"],
                               capture_output=True, text=True, timeout=30)
        alive = os.path.exists(f"/proc/{pid}")
        if probe.stdout.strip() == "none" and not alive:
            return
        assert time.monotonic() < give_up, (probe.stdout, probe.stderr, alive)
        time.sleep(0.2)


@pytest.fixture(scope="module")
def bare(lab, tmp_path_factory):
    """Last in the module: the host without any python (its sshd config changed for good)."""
    _without_python(lab, tmp_path_factory)
    inventory = _inventory(lab, tmp_path_factory.mktemp("bare"), gpuops_python=None, sglang_python=None)
    return lab.hosts[0], inventory


@pytest.mark.parametrize("command", ["apply", "rollback", "history"])
def test_no_python_on_the_host_is_named(bare, run_gpuops, command) -> None:
    host, inventory = bare
    before = tree_hashes(host.dir, skip_runs=True)
    done = run_gpuops(*COMMANDS[command], "-i", str(inventory), timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    _said_once(done, NONE_FOUND if command == "apply" else
               "no python: no python3 (nor python) on this host's PATH; set gpuops_python to a python 3.8+")
    assert tree_hashes(host.dir, skip_runs=True) == before


def test_inspect_and_advise_say_they_cannot_tell_and_advise_nothing(bare, run_gpuops) -> None:
    _, inventory = bare
    inspected = run_gpuops("inspect", "host", "-i", str(inventory), timeout=300)
    assert "gates: unknown (no python 3.8+ found on the host)" in inspected.stdout, inspected.stdout[-3000:]
    advised = run_gpuops("advise", "-i", str(inventory), timeout=300)
    assert "apply now" not in advised.stdout, advised.stdout
    assert "fusion-sm120): cannot tell: no python 3.8+ found on the host" in advised.stdout, advised.stdout
