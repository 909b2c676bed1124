"""The results store's writes (issue 42): a figure NaN, infinite or absurd is never stored as
measured (null, said in a note); a disk that cannot take a result says exactly what was and was not
stored (a real full filesystem: a 256 KiB tmpfs); the files, the index and a folder gpuops makes are
readable by their owner only, as the results are. A real result file (SGLang 0.5.16 on an H200) is
the document written."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest

from test_backup_disk_full import full_state_dir  # noqa: F401  (the fixture: a real full filesystem)

from gpuops.bench.store import INDEX_NAME, ResultsStore
from gpuops.errors import GpuopsError

REAL = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-x1" / "real-sglang" / "call2" /
        "results" / "20261202T023751Z_gpu0_decode_c62f795352.json")


def _result(new_id: str = "w1") -> dict:
    doc = json.loads(REAL.read_text())
    doc["id"] = new_id
    return doc


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_non_finite_and_absurd_figures_are_stored_as_missing_and_said(tmp_path: Path) -> None:
    result = _result()
    result["summary"]["output_tokens_per_s"] = math.nan
    result["summary"]["ttft_ms_p50"] = math.inf
    result["summary"]["itl_ms_p50"] = 1e308
    store = ResultsStore(tmp_path / "results")
    path = store.save(result)

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} stored in {path.name}")

    stored = json.loads(path.read_text(), parse_constant=refuse)
    assert [stored["summary"][k] for k in ("output_tokens_per_s", "ttft_ms_p50", "itl_ms_p50")] == [None] * 3
    said = " ".join(store.lines())
    assert path.name in said and "summary.output_tokens_per_s is NaN" in said and "summary.ttft_ms_p50 is Infinity" in said
    assert "summary.itl_ms_p50 is 1e+308" in said
    assert math.isnan(result["summary"]["output_tokens_per_s"])  # the caller's copy stays as measured
    listed = ResultsStore(tmp_path / "results").entries()
    assert [(e.id, e.output_tokens_per_s, e.flagged) for e in listed] == [("w1", None, None)]


def test_files_index_and_a_new_folder_are_the_owners_only(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "new" / "results")
    path = store.save(_result())
    store.save_traces("w1", [{"file": "trace.json.gz", "base64": "AAAA"}])
    assert _mode(path) == 0o600
    assert _mode(path.parent / INDEX_NAME) == 0o600
    assert _mode(path.parent) == 0o700
    assert _mode(path.parent / "traces" / "w1") == 0o700
    assert _mode(path.parent / "traces" / "w1" / "trace.json.gz") == 0o600


def test_a_folder_that_was_there_keeps_its_mode(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    ResultsStore(folder).save(_result())
    assert _mode(folder) == 0o755


@pytest.fixture
def full_folder(full_state_dir: Path) -> Path:
    """A real filesystem of 256 KiB (tmpfs), as test_backup_disk_full mounts it."""
    return full_state_dir


def test_a_full_disk_says_the_result_was_not_stored_and_leaves_nothing(full_folder: Path) -> None:
    big = _result("big1")
    big["padding"] = "x" * 400_000  # more than the 256 KiB filesystem holds
    store = ResultsStore(full_folder)
    with pytest.raises(GpuopsError) as raised:
        store.save(big)
    said = str(raised.value)
    assert f"result big1 of {big['host']} not saved in {full_folder}: ENOSPC" in said, said
    assert "nothing of it was stored" in said
    assert [p.name for p in full_folder.iterdir() if p.name != INDEX_NAME] == []  # no partial file left


def test_a_trace_the_disk_cannot_take_is_named_and_the_others_kept(full_folder: Path) -> None:
    import base64

    small = base64.b64encode(b"t" * 100).decode()
    large = base64.b64encode(b"T" * 400_000).decode()
    kept = ResultsStore(full_folder).save_traces("r1", [{"file": "a.json", "base64": small},
                                                        {"file": "b.json", "base64": large}])
    assert kept[0]["path"] and Path(kept[0]["path"]).read_bytes() == b"t" * 100
    assert kept[1]["path"] is None and kept[1]["error"].startswith(f"not saved in {full_folder / 'traces' / 'r1'}: ENOSPC")
    assert sorted(p.name for p in (full_folder / "traces" / "r1").iterdir()) == ["a.json"]
