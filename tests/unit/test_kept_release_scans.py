"""Release scans kept across test runs (``labtools.kept_scan``): a kept scan is used only for the
very inputs it was made from, so a changed scanner, release, site, option or python scans again.

The scans here are real (``gates.local.scan_site_output``: the probe's sh script, the real
scanner) of a small tree, counted as they run."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from gpuops.gates import probe
from gpuops.gates.local import scan_site, scan_site_output
from gpuops.gates.probe import scan_options, scanner_digest
from labtools import KEPT_SCANNER_DIGESTS, kept_scan, release_scan_key, scan_key, scanning_python

GATED = "import torch\n\ndef fused_allreduce():\n    if torch.cuda.get_device_capability()[0] == 12:\n        return False\n    return True\n"


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (pkg / "communicator.py").write_text(GATED)
    return pkg.parent


@pytest.fixture()
def counted(site: Path) -> tuple[list[int], Callable[[], tuple[str, str, int]]]:
    """The real scan of ``site``, and how many times it ran."""
    runs: list[int] = []

    def scan() -> tuple[str, str, int]:
        runs.append(1)
        return scan_site_output(site)

    return runs, scan


def _key(scanned: Path, **changed: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {"release": "0.0.1", "site": scanned, "with_sources": False,
                              "scanner_digest": "a" * 64, "python": {"executable": "/usr/bin/python3", "version": "3.11.7"},
                              "options": {"keywords": ["allreduce"]}}
    inputs.update(changed)
    return scan_key(**inputs)


def test_a_kept_scan_serves_the_next_run_as_the_scan_itself(site: Path, counted, tmp_path: Path) -> None:
    """The promise: the second run scans nothing and gets what a scan gives (a bug that keeps a
    torn or partial output, or parses it differently, breaks the equality)."""
    runs, scan = counted
    first = kept_scan(_key(site), scan, tmp_path / "kept")
    again = kept_scan(_key(site), scan, tmp_path / "kept")
    assert len(runs) == 1
    assert first.known and len(first.gates) == 1
    assert again == first
    untimed = {"elapsed_s": None, "cpu_s": None}  # what a scan measures of itself differs run to run
    assert dataclasses.replace(first, **untimed) == dataclasses.replace(scan_site(site), **untimed)


@pytest.mark.parametrize("changed", [
    {"release": "0.0.2"},
    {"site": "/elsewhere/site"},
    {"with_sources": True},
    {"scanner_digest": "b" * 64},
    {"python": {"executable": "/opt/python3", "version": "3.11.7"}},
    {"python": {"executable": "/usr/bin/python3", "version": "3.12.1"}},
    {"options": {"keywords": ["allreduce", "fusion"]}},
], ids=lambda changed: "-".join(f"{k}={v}" for k, v in changed.items())[:60])
def test_each_input_of_the_key_misses(site: Path, counted, tmp_path: Path, changed: dict[str, Any]) -> None:
    """A scan kept for other inputs is never taken for this one (a key that leaves one input out
    hits here), and the first entry is still there for its own key."""
    runs, scan = counted
    kept_scan(_key(site), scan, tmp_path / "kept")
    kept_scan(_key(site, **changed), scan, tmp_path / "kept")
    assert len(runs) == 2
    kept_scan(_key(site), scan, tmp_path / "kept")
    assert len(runs) == 2


def test_a_changed_scanner_text_misses(site: Path, counted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``release_scan_key`` takes the digest of the scanner the host runs (the one in the probe's own
    options), so an edit of the scanner scans again; and the python it names is the one that scans."""
    runs, scan = counted
    key = release_scan_key("0.0.1", site, False)
    assert key["scanner_digest"] == scanner_digest() and f'"scanner_digest": "{scanner_digest()}"' in \
        probe.gate_scan_script(scan_options())
    made = kept_scan(key, scan, tmp_path / "kept")
    assert key["python"]["version"].startswith(f"{made.python} ")
    text = probe.scanner_source()
    monkeypatch.setattr(probe, "scanner_source", lambda: text + "\n# one more line\n")
    changed = release_scan_key("0.0.1", site, False)
    assert changed["scanner_digest"] != key["scanner_digest"]
    kept_scan(changed, scan, tmp_path / "kept")
    assert len(runs) == 2


def test_another_python3_on_path_is_another_key(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The python is the one ``sh`` finds as ``python3`` when the scan runs, so a PATH that finds
    another interpreter gives another key (a key probed once and for all would not change)."""
    before = release_scan_key("0.0.1", site, False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    after = release_scan_key("0.0.1", site, False)
    assert after["python"] == {**scanning_python(), "executable": str(bin_dir / "python3")}
    assert after != before


def test_a_torn_entry_is_scanned_again(site: Path, counted, tmp_path: Path) -> None:
    runs, scan = counted
    kept_scan(_key(site), scan, tmp_path / "kept")
    (entry,) = (tmp_path / "kept" / ("a" * 64)).glob("*.json")
    entry.write_text(entry.read_text()[:100])
    assert kept_scan(_key(site), scan, tmp_path / "kept").known
    assert len(runs) == 2


def test_only_the_newest_scanner_digests_are_kept(site: Path, counted, tmp_path: Path) -> None:
    """Writing a scan prunes the scans of all but the most recently used scanner digests."""
    runs, scan = counted
    root = tmp_path / "kept"
    for age, digest in enumerate("bcdef", start=1):
        (root / (digest * 64)).mkdir(parents=True)
        os.utime(root / (digest * 64), (1_000_000 - age, 1_000_000 - age))
    kept_scan(_key(site), scan, root)
    newest = ["a" * 64] + [d * 64 for d in "bcdef"][:KEPT_SCANNER_DIGESTS - 1]
    assert sorted(p.name for p in root.iterdir()) == sorted(newest)


def test_a_digest_in_use_is_not_pruned(site: Path, counted, tmp_path: Path) -> None:
    """A hit counts as use: a digest whose scans are still being read outlives newer unused ones."""
    runs, scan = counted
    root = tmp_path / "kept"
    kept_scan(_key(site), scan, root)
    for age, digest in enumerate("abcdef", start=1):
        (root / (digest * 64)).mkdir(parents=True, exist_ok=True)
        os.utime(root / (digest * 64), (1_000_000 - 10 * age, 1_000_000 - 10 * age))
    kept_scan(_key(site), scan, root)  # "a", now the oldest, is read
    kept_scan(_key(site, scanner_digest="0" * 64), scan, root)
    assert len(runs) == 2
    assert "a" * 64 in {p.name for p in root.iterdir()}
    assert len(list(root.iterdir())) == KEPT_SCANNER_DIGESTS
