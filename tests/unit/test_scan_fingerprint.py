"""The host's fingerprint of a gate scan's inputs (remote/scan_fingerprint.py): it must change with
everything a scan's result depends on, and with every way gpuops itself changes a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuops.remote.scan_fingerprint import known_fingerprints, tree_fingerprint

OPTS = {"keywords": ["flashinfer"], "scanner_digest": "a" * 64}


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt" / "layers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "layers" / "communicator.py").write_text("def f():\n    return is_sm90_supported()\n")
    (pkg / "README.md").write_text("not python")
    return pkg


def fp(root: Path, opts: dict | None = None, version: str | None = "0.5.8") -> str:
    value = tree_fingerprint(str(root), OPTS if opts is None else opts, version)
    assert value is not None and len(value) == 64
    return value


def test_stable_when_nothing_changes(root: Path) -> None:
    assert fp(root) == fp(root)
    (root / "README.md").write_text("edited, but not a .py file: scans do not read it")
    (root / "srt" / "__pycache__").mkdir()
    (root / "srt" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")  # python writing its caches
    os.utime(root / "srt")  # a directory's times are not inputs
    assert fp(root) == fp(root)


def test_changes_with_size(root: Path) -> None:
    path = root / "srt" / "layers" / "communicator.py"
    before = fp(root)
    stat = path.stat()
    with open(path, "a") as fh:  # in place: same inode
        fh.write("# more\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old mtime put back
    assert path.stat().st_ino == stat.st_ino
    assert fp(root) != before


def test_changes_with_mtime(root: Path) -> None:
    path = root / "srt" / "layers" / "communicator.py"
    before = fp(root)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert fp(root) != before


def test_changes_when_written_as_gpuops_writes(root: Path) -> None:
    """gpuops' apply writes a temp file and renames it over the old one (the mode and, here, even
    the size and mtime kept): the new inode shows."""
    path = root / "srt" / "layers" / "communicator.py"
    before = fp(root)
    stat = path.stat()
    tmp = path.with_name(".communicator.py.tmp")
    tmp.write_text(path.read_text().replace("sm90", "sm12"))  # same size
    os.utime(tmp, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(tmp, path)
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert fp(root) != before


def test_changes_with_added_removed_and_renamed_files(root: Path) -> None:
    before = fp(root)
    extra = root / "srt" / "new_gate.py"
    extra.write_text("")
    added = fp(root)
    assert added != before
    extra.rename(root / "srt" / "renamed.py")
    assert fp(root) not in (before, added)
    (root / "srt" / "renamed.py").unlink()
    assert fp(root) == before
    (root / "srt" / "layers" / "communicator.py").unlink()
    assert fp(root) != before


def test_changes_with_tests_and_hidden_dirs_too(root: Path) -> None:
    """A superset of what the scanner reads: cheaper to stat a few more files than to be wrong."""
    before = fp(root)
    (root / "test").mkdir()
    (root / "test" / "test_x.py").write_text("")
    assert fp(root) != before


def test_changes_with_options_scanner_and_version(root: Path) -> None:
    base = fp(root)
    assert fp(root, {**OPTS, "keywords": ["other"]}) != base
    assert fp(root, {**OPTS, "scanner_digest": "b" * 64}) != base
    assert fp(root, {k: v for k, v in OPTS.items() if k != "scanner_digest"}) != base
    assert fp(root, version="0.5.9") != base


def test_options_that_do_not_change_a_scan_leave_it_alone(root: Path) -> None:
    base = fp(root)
    assert fp(root, {**OPTS, "jobs": 3}) == base
    assert fp(root, {**OPTS, "with_sources": True}) == base
    assert fp(root, {**OPTS, "known": ["c" * 64]}) == base


def test_another_root_with_the_same_files_differs(root: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "other" / "sglang"
    shutil.copytree(root, copy, copy_function=shutil.copy2)  # same sizes and mtimes, another path
    assert fp(copy) != fp(root)


def test_the_same_files_linked_under_another_root_are_the_same_tree(root: Path, tmp_path: Path) -> None:
    """Hard links (the lab's hosts, uv's installs from its cache) are the very same files: one scan
    serves every root that links them."""
    linked = tmp_path / "linked" / "sglang"
    for path in sorted(root.rglob("*")):
        dest = linked / path.relative_to(root)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dest)
    assert fp(linked) == fp(root)


def test_unwalkable_tree_gives_no_fingerprint(tmp_path: Path) -> None:
    assert tree_fingerprint(str(tmp_path / "missing"), OPTS, None) is None


def test_known_fingerprints_reads_only_strings() -> None:
    assert known_fingerprints({"known": ["a" * 64, 3, "", None]}) == ("a" * 64,)
    assert known_fingerprints({"known": "a" * 64}) == ()
    assert known_fingerprints({}) == ()
