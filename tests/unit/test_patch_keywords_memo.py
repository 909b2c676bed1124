"""gates/probe.patch_keywords: the patchable features' keywords are kept per gpuops code and catalog
file, and a kept list is never used once either changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuops import memo
from gpuops.gates import BUILTIN_CATALOG, catalog, probe


def _catalog_text(*keywords: str) -> str:
    return json.dumps({"features": {
        "fused": {"keywords": list(keywords), "patch": {},
                  "gates": [{"role": "runtime", "match": {"function": "f"}}]},
        "judged_only": {"keywords": ["never_whole"], "gates": [{"role": "runtime", "match": {"function": "g"}}]},
    }})


@pytest.fixture
def scans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "scans"
    monkeypatch.setenv("GPUOPS_KEEP", str(where))
    return where


class CountingLoads:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = catalog.load_catalog

        def load(path=None):  # type: ignore[no-untyped-def]
            self.calls += 1
            return real(path)

        monkeypatch.setattr(catalog, "load_catalog", load)


def test_the_builtin_catalog_keywords_are_kept_and_equal_to_a_fresh_read(scans: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads = CountingLoads(monkeypatch)
    fresh = [p.pattern for f in catalog.load_catalog().features if f.patchable for p in f.keywords]
    assert fresh and loads.calls == 1
    assert probe.patch_keywords() == fresh and loads.calls == 2  # first: read, then kept
    assert probe.patch_keywords() == fresh and loads.calls == 2  # then: recalled
    assert probe.scan_options()["keywords"] == fresh and loads.calls == 2
    assert BUILTIN_CATALOG == Path(catalog.__file__).with_name("catalog.yaml")
    # Another gpuops (an upgrade, an edited catalog.yaml: both are in the code digest) reads it again.
    monkeypatch.setattr(memo, "code_digest", lambda: "another gpuops")
    assert probe.patch_keywords() == fresh and loads.calls == 3


def test_an_edited_catalog_is_read_again(scans: Path, tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(_catalog_text("allreduce_fusion"))
    assert probe.patch_keywords(path) == ["allreduce_fusion"]
    path.write_text(_catalog_text("allreduce_fusion", "rmsnorm"))
    assert probe.patch_keywords(path) == ["allreduce_fusion", "rmsnorm"]
    # Same size, and the mtime put back: the inode of the replacement still tells them apart.
    stat = path.stat()
    replacement = tmp_path / "new.yaml"
    replacement.write_text(_catalog_text("allreduce_fusiom", "rmsnorm"))
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, path)
    assert probe.patch_keywords(path) == ["allreduce_fusiom", "rmsnorm"]


def test_other_gpuops_code_reads_the_catalog_again(scans: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(_catalog_text("allreduce_fusion"))
    assert probe.patch_keywords(path) == ["allreduce_fusion"]
    loads = CountingLoads(monkeypatch)
    monkeypatch.setattr(memo, "code_digest", lambda: "another gpuops")
    assert probe.patch_keywords(path) == ["allreduce_fusion"] and loads.calls == 1


def test_torn_or_foreign_entries_are_read_again(scans: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(_catalog_text("allreduce_fusion"))
    assert probe.patch_keywords(path) == ["allreduce_fusion"]
    (entry,) = (scans / "catalog").glob("*.json")
    data = json.loads(entry.read_text())
    for bad in ({**data, "value": "allreduce_fusion"}, {**data, "value": [1]}, {**data, "kind": "judged"}):
        entry.write_text(json.dumps(bad))
        loads = CountingLoads(monkeypatch)
        assert probe.patch_keywords(path) == ["allreduce_fusion"] and loads.calls == 1
    entry.write_text("{torn")
    assert probe.patch_keywords(path) == ["allreduce_fusion"]


def test_off_reads_the_catalog_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path / "cache"))
    loads = CountingLoads(monkeypatch)
    probe.patch_keywords()
    probe.patch_keywords()
    assert loads.calls == 2
    assert not (tmp_path / "cache").exists()
