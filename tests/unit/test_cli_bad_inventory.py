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
    for name, text in [*BAD.items(), ("missing.yml", None)]:
        inventory = tmp_path / name
        if text is not None:
            inventory.write_text(text)
        before = _snapshot(gpuops_home, tmp_path)
        done = run_gpuops(*command, "-i", str(inventory), cwd=tmp_path, timeout=60)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuops: error: ") and name in lines[0], (name, done.stderr)
        assert done.stdout == ""
        assert _snapshot(gpuops_home, tmp_path) == before, name  # no journal, no results dir, no known_hosts
