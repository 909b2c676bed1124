"""gpuops.prefetch: modules imported in the background, joined before use, failures left to the caller."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuops import prefetch as prefetch_mod


@pytest.fixture()
def pkg_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(prefetch_mod, "_STARTED", {})
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("gpuops_pf_")]:
        del sys.modules[name]


def test_imports_in_the_background_and_join_waits(pkg_dir: Path) -> None:
    (pkg_dir / "gpuops_pf_a.py").write_text("import time\ntime.sleep(0.05)\nVALUE = 1\n")
    handle = prefetch_mod.prefetch("gpuops_pf_a")
    handle.join()
    assert sys.modules["gpuops_pf_a"].VALUE == 1
    assert handle.thread is not None and not handle.thread.is_alive()


def test_a_broken_module_is_left_to_the_callers_import(pkg_dir: Path) -> None:
    (pkg_dir / "gpuops_pf_bad.py").write_text("raise ValueError('broken on purpose')\n")
    prefetch_mod.prefetch("gpuops_pf_bad").join()  # no exception here
    assert "gpuops_pf_bad" not in sys.modules
    with pytest.raises(ValueError, match="broken on purpose"):
        __import__("gpuops_pf_bad")


def test_same_names_share_one_prefetch_and_loaded_ones_start_no_thread(pkg_dir: Path) -> None:
    (pkg_dir / "gpuops_pf_b.py").write_text("VALUE = 2\n")
    first = prefetch_mod.prefetch("gpuops_pf_b")
    assert prefetch_mod.prefetch("gpuops_pf_b") is first
    first.join()
    assert prefetch_mod.prefetch("json").thread is None
