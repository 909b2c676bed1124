"""One switch for every kept result: ``GPUOPS_KEEP=off`` turns off kept scans (and the verdicts and
patch keywords kept beside them), recalled no-op plans and kept GPU facts at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.apply import kept_facts, noop_memo
from gpuops.gates import scan_cache


def test_gpuops_keep_off_turns_every_kept_result_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path))
    for env in ("GPUOPS_SCAN_CACHE", "GPUOPS_PLAN_CACHE", "GPUOPS_FACTS_CACHE", "GPUOPS_KEEP"):
        monkeypatch.delenv(env, raising=False)
    where = (scan_cache.cache_root(), noop_memo.memo_dir(), kept_facts.cache_dir())
    assert where == (tmp_path / "scans", tmp_path / "plans", tmp_path / "facts")
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    assert (scan_cache.cache_root(), noop_memo.memo_dir(), kept_facts.cache_dir()) == (None, None, None)
    monkeypatch.setenv("GPUOPS_SCAN_CACHE", str(tmp_path / "mine"))  # a kind's own directory does not turn it back on
    assert scan_cache.cache_root() is None
    monkeypatch.setenv("GPUOPS_KEEP", "on")
    assert scan_cache.cache_root() == tmp_path / "mine"
