"""Helpers for tests that change lab hosts: fingerprints of a host's files and its server's view.

Imported as ``labtools`` (tests/conftest.py puts this directory on ``sys.path``).
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path
from typing import Any

# Files that move on their own (logs, pid files): never part of "the host is as it was".
VOLATILE = {"sshd.log", "sglang.log", "sglang.pid", "sshd.pid"}


def tree_hashes(root: Path, skip_runs: bool = False) -> dict[str, str]:
    """sha256 of every file under a lab host dir, by relative path.

    ``skip_runs`` leaves out gpuops' own bookkeeping (state/runs backups, state/calls transaction
    folders, journal, lock, a consumed lab fault file), which an
    apply or a rollback is expected to grow; everything the server reads must still match.
    """
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_dir() or path.is_symlink() or path.name in VOLATILE or path.suffix == ".pyc":
            continue
        if skip_runs and (rel.parts[:2] in (("state", "runs"), ("state", "calls"))
                          or path.name in ("journal.jsonl", "lock", "lab-fault.used")):
            continue
        out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def server_info(port: int) -> dict[str, Any]:
    """The stand-in server's /get_server_info (its flags and environment as it runs)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=10) as response:
        return json.loads(response.read())
