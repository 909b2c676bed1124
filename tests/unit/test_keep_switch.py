"""One switch and one place for every kept result (gpuops/memo.py): ``GPUOPS_KEEP=off`` turns off
kept scans, verdicts, catalog values, no-op plans, discoveries, GPU facts and bundled helpers at
once; a path moves them all; unset, they live below ``$GPUOPS_CACHE/kept``; ``memo.clear()``
forgets them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops import memo
from gpuops.inventory.model import Host

HOST = Host(name="h01", address="127.0.0.1", port=2222, user="root", key_file=None, connection="ssh", groups=("all",))


def _where_each_kind_keeps() -> dict[str, Path | None]:
    from gpuops.apply import kept_facts
    from gpuops.gates import scan_cache
    from gpuops.shipping import bundle_cache

    scans = scan_cache.for_host(HOST)
    facts = kept_facts.guard(HOST, []).key
    bundles = bundle_cache.bundle_key("gate_scan", Path("/x"))
    return {
        "scans": None if scans is None else memo.directory(memo.Kind.SCANS, scans.scope),
        "facts": None if facts is None else memo.directory(facts.kind),
        "bundles": None if bundles is None else memo.directory(bundles.kind),
        **{kind.directory: memo.directory(kind) for kind in (memo.Kind.PLANS, memo.Kind.JUDGED, memo.Kind.CATALOG)},
    }


def test_gpuops_keep_is_the_one_switch_and_the_one_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUOPS_KEEP", raising=False)
    assert all(str(where).startswith(str(tmp_path / "cache" / "kept")) for where in _where_each_kind_keeps().values())
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "mine"))
    assert all(str(where).startswith(str(tmp_path / "mine")) for where in _where_each_kind_keeps().values())
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    assert set(_where_each_kind_keeps().values()) == {None}


def test_put_get_and_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))
    key = memo.key(memo.Kind.JUDGED, "inputs", 1)
    assert key is not None and memo.get(key) is None
    memo.put(key, {"value": 1})
    assert memo.get(key) == {"value": 1, "format": memo.FORMAT, "key": key.digest, "kind": "judged"}
    # another kind with the same digest is another entry: a key is its kind and its digest
    assert memo.get(memo.Key(memo.Kind.PLANS, key.digest)) is None
    memo.clear()
    assert memo.get(key) is None and not (tmp_path / "kept").exists()
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    memo.put(key, {"value": 1})
    assert memo.get(key) is None and not (tmp_path / "kept").exists()


def test_flush_cache_judges_again_and_keeps_the_new_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuops.gates.evaluate import GateReport
    from gpuops.gates.judge_memo import judge_or_recall
    from gpuops.gates.scan import GateScan

    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))
    scan = GateScan(known=True, root="/s", version="0.5.8", python="3.11", fingerprint="a" * 64)
    calls: list[int] = []

    def judge() -> GateReport:
        calls.append(1)
        return GateReport(gates=[], features={"f": {"status": str(len(calls))}}, version="0.5.8", gpu="12.0", known=True)

    def run(recall: bool = True) -> GateReport:
        return judge_or_recall(scan, "12.0", "12.8", None, None, judge, recall=recall)

    assert run().features == {"f": {"status": "1"}} and run().features == {"f": {"status": "1"}} and len(calls) == 1
    assert run(recall=False).features == {"f": {"status": "2"}} and len(calls) == 2  # --flush-cache
    assert run().features == {"f": {"status": "2"}} and len(calls) == 2  # what it found is kept
