"""The memo's listings (src/gpuops/memo.py): a scope's keys newest first, and other scopes' keys
newest first across scopes, listing only the directories whose entries may come next, so that
offering a host the newest few scans costs the same with 3 hosts kept or 3,000."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from gpuops import memo

SCANS = memo.Kind.SCANS
DAY_NS = 86_400 * 10**9
NOW_NS = time.time_ns()


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(memo.KEEP_ENV, str(tmp_path / "kept"))
    return tmp_path / "kept"


def _entry(scope: str, digest: str, age_days: float) -> memo.Key:
    """An entry written ``age_days`` ago, with its scope's directory stamped as a write stamps it."""
    key = memo.Key(SCANS, digest, scope)
    memo.put(key, {"n": digest})
    where = memo.directory(SCANS, scope)
    assert where is not None
    stamp = NOW_NS - int(age_days * DAY_NS)
    os.utime(where / f"{digest}.json", ns=(stamp, stamp))
    newest = max(os.stat(p).st_mtime_ns for p in where.glob("*.json"))
    os.utime(where, ns=(newest, newest))
    return key


def test_other_scopes_come_newest_entry_first_and_the_own_scope_never(kept: Path) -> None:
    _entry("a", "a-old", 9)
    _entry("a", "a-new", 1)
    _entry("b", "b-mid", 5)
    _entry("c", "c-2", 2)
    _entry("c", "c-7", 7)
    _entry("me", "mine", 0)
    order = [k.digest for k in memo.keys_of_other_scopes(SCANS, "me")]
    assert order == ["a-new", "c-2", "b-mid", "c-7", "a-old"]
    assert [k.digest for k in memo.keys(SCANS, "c")] == ["c-2", "c-7"]


def test_a_touched_entry_comes_first(kept: Path) -> None:
    old = _entry("a", "old", 9)
    _entry("b", "new", 1)
    memo.touch(old)
    assert [k.digest for k in memo.keys_of_other_scopes(SCANS, "me")][0] == "old"


def test_the_newest_few_list_a_few_directories(kept: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for index in range(300):
        _entry(f"host{index:03d}", f"scan{index:03d}", 30 + index)
    _entry("fresh1", "f1", 1)
    _entry("fresh2", "f2", 2)
    listed: list[str] = []
    real = memo._entries

    def spy(where: Path) -> list[tuple[int, str]]:
        listed.append(where.name)
        return real(where)

    monkeypatch.setattr(memo, "_entries", spy)
    taken = [k.digest for k in itertools.islice(memo.keys_of_other_scopes(SCANS, "me"), 3)]
    assert taken == ["f1", "f2", "scan000"]
    assert sorted(listed) == ["fresh1", "fresh2", "host000"]  # not 302 directories
    assert len(list(memo.keys_of_other_scopes(SCANS, "me"))) == 302


def test_a_scope_gone_or_never_made_lists_nothing(kept: Path) -> None:
    assert list(memo.keys_of_other_scopes(SCANS, "me")) == []
    assert memo.keys(SCANS, "nobody") == []
    (kept / SCANS.directory).mkdir(parents=True)
    (kept / SCANS.directory / "stray-file").write_text("")
    assert list(memo.keys_of_other_scopes(SCANS, "me")) == []
