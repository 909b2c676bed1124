"""A malformed inventory, through the CLI: exit 2, one line on stderr naming the file, nothing changed.

README: "2 for bad input (one line on stderr naming the file or host, nothing changed)". Every command
that reads an inventory is tried with every kind of bad inventory; none gets as far as a host.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BAD = {
    "yaml-syntax.yml": "all:\n  hosts:\n    a: [\n",
    "port.yml": "all:\n  hosts:\n    a:\n      ansible_port: abc\n",
    "list.yml": "- just\n- a list\n",
    "ini-header.ini": "[gpus\nh1 ansible_host=127.0.0.1\n",
}
COMMANDS = [
    ("inspect", "host"),
    ("apply", "nccl-env"),
    ("apply", "nccl-env", "--check"),
    ("bench", "--remote", "--suite", "decode"),
    ("history",),
    ("rollback",),
]


def _snapshot(*roots: Path) -> dict[str, int]:
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_size
            for root in roots for d, _, files in os.walk(root) for f in files}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c))
def test_malformed_inventory_is_one_line_and_exit_2(run_gpuops, gpuops_home: Path, tmp_path: Path, command) -> None:
    """Each bad inventory in a gpuops process of its own, forked from one that imported gpuops once
    (run_gpuops.forked: a process each costs a fork, not a Python start); the same in a fresh
    interpreter: test_a_fresh_process_says_the_same."""
    names = [*BAD, "missing.yml"]
    for name, text in BAD.items():
        (tmp_path / name).write_text(text)
    before = _snapshot(gpuops_home, tmp_path)
    runs = run_gpuops.forked([(*command, "-i", str(tmp_path / name)) for name in names], cwd=tmp_path, timeout=60)
    for name, done in zip(names, runs):
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuops: error: ") and name in lines[0], (name, done.stderr)
        assert done.stdout == ""
    assert _snapshot(gpuops_home, tmp_path) == before  # no journal, no results dir, no known_hosts


def test_a_fresh_process_says_the_same(run_gpuops, gpuops_home: Path, tmp_path: Path) -> None:
    """One bad inventory through `python -m gpuops.cli` itself (a fresh interpreter: nothing imported
    before the command line): exit 2, the one line the forked processes above print, no traceback."""
    inventory = tmp_path / "yaml-syntax.yml"
    inventory.write_text(BAD["yaml-syntax.yml"])
    before = _snapshot(gpuops_home, tmp_path)
    fresh = run_gpuops("inspect", "host", "-i", str(inventory), cwd=tmp_path, timeout=60)
    forked, = run_gpuops.forked([("inspect", "host", "-i", str(inventory))], cwd=tmp_path, timeout=60)
    assert fresh.returncode == 2 and fresh.stdout == "", fresh.stderr
    assert fresh.stderr.startswith("gpuops: error: ") and len(fresh.stderr.strip().splitlines()) == 1, fresh.stderr
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (forked.returncode, forked.stdout, forked.stderr)
    assert _snapshot(gpuops_home, tmp_path) == before
