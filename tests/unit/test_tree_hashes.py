"""``labtools.tree_hashes``, the map of a lab host's files that the rollback tests compare before and
after: its kept hashes (``file_sha256``) never hide a change, however soon after the last look it came."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from labtools import tree_hashes


def test_a_same_size_write_right_after_a_look_is_seen(tmp_path: Path) -> None:
    """Written in place right after the look, the size and mtime put back: seen. Where the kernel
    stamps a write with its coarse clock (before Linux 6.13's multigrain timestamps) the ctime may stay
    the same too, which is why a file changed in the last second is never kept; on this project's 6.18
    machine the ctime always moves, so the mutant that keeps such files is not caught here."""
    target = tmp_path / "sglang.env"
    target.write_text("NCCL_MIN_NCHANNELS='1'\n")
    before = tree_hashes(tmp_path)
    old = target.stat()
    with open(target, "r+") as handle:  # in place: the same inode
        handle.write("NCCL_MIN_NCHANNELS='2'\n")
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))  # and the old mtime: the ctime is most likely the same tick
    assert tree_hashes(tmp_path) != before


def test_a_kept_hash_is_used_only_while_the_file_is_unchanged(tmp_path: Path) -> None:
    """A file untouched for a second is hashed once; an in-place write of the same size then moves its
    ctime, so the next look reads it again. A mode change alone is seen too."""
    target = tmp_path / "server.py"
    target.write_text("x = 1\n")
    time.sleep(1.1)  # older than the last second: its hash is kept
    before = tree_hashes(tmp_path)
    assert tree_hashes(tmp_path) == before
    old = target.stat()
    with open(target, "r+") as handle:
        handle.write("x = 2\n")
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))  # size and mtime as they were: only the ctime moves
    after = tree_hashes(tmp_path)
    assert after != before and after["server.py"].endswith(hashlib.sha256(b"x = 2\n").hexdigest())
    os.chmod(target, 0o600)
    assert tree_hashes(tmp_path)["server.py"].startswith("file 0o600 ")

