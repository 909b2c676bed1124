"""No module in src/ grows past about 600 lines: a file that long holds more than one idea, and the
next engineer cannot find a behaviour in one place (docs/ARCHITECTURE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuops"
LIMIT = 600

# Files over the limit today, each with why it is still allowed. Remove an entry once its file is
# split; the test below fails if an entry is no longer needed, so this list only ever shrinks.
ALLOWED: set[str] = set()


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _modules() -> list[Path]:
    """Every module of src/gpuops except those on ALLOWED."""
    return sorted(p for p in SRC.rglob("*.py")
                  if "__pycache__" not in p.parts and str(p.relative_to(SRC)) not in ALLOWED)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_module_is_at_most_600_lines(path: Path):
    name = str(path.relative_to(SRC))
    assert _lines(path) <= LIMIT, f"{name} has {_lines(path)} lines: split it by concern (limit {LIMIT})"


def test_allow_list_holds_only_files_still_over_the_limit():
    stale = [name for name in sorted(ALLOWED) if not (SRC / name).is_file() or _lines(SRC / name) <= LIMIT]
    assert not stale, f"remove from ALLOWED (gone or now small enough): {stale}"
