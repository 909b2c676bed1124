"""The bundler's finished scripts, kept by the memo layer (``memo.Kind.BUNDLES``).

Finding a helper's modules parses each with ``ast``, so the finished script is kept, one entry per
helper and helper directory (the key), with the size and mtime of every file it came from (the
entry, each bundled module, the bundler and this module), and used again only while all of them are
unchanged (what Python's .pyc does): which modules a script bundles is known only after bundling, so
they are checked on reading, not digested into the key. Apart from ``bundle.py`` so that a command
whose helpers are all kept reads them without importing the bundler (``gpuops.shipping.source``).
"""

from __future__ import annotations

from pathlib import Path

from gpuops import memo


def bundle_key(entry: str, search_dir: Path) -> memo.Key | None:
    """None when keeping is off (``GPUOPS_KEEP=off``)."""
    return memo.key(memo.Kind.BUNDLES, entry, str(search_dir.resolve())) if memo.root() is not None else None


def stamp(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def read(key: memo.Key) -> str | None:
    """The kept script, when every file it came from is as it was; else None."""
    data = memo.get(key)
    try:
        if data is not None and data["files"] and all(stamp(Path(name)) == kept for name, kept in data["files"].items()):
            return str(data["script"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def write(key: memo.Key, script: str, files: list[Path]) -> None:
    """Keep ``script`` with the stamps of ``files``; never fails the command."""
    try:
        stamps = {str(f): stamp(f) for f in [*files, Path(__file__)]}
    except OSError:
        return
    memo.put(key, {"files": stamps, "script": script})
