"""The bundler's finished scripts, kept on disk (``bundle.bundled_source(cached=True)``).

Finding a helper's modules parses each with ``ast``, so the finished script is kept in
``$GPUOPS_CACHE/bundles`` (else ``~/.cache/gpuops/bundles``), one file per entry and helper
directory, with the size and mtime of every file it came from (the entry, each bundled module,
the bundler and this module), and used again only while all of them are unchanged (what Python's
.pyc does). Apart from ``bundle.py`` so that a command whose helpers are all kept reads them
without importing the bundler (``gpuops.remote.source``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_file(entry: str, search_dir: Path, cache_dir: Path | None = None) -> Path:
    if cache_dir is None:
        base = os.environ.get("GPUOPS_CACHE")
        cache_dir = (Path(base).expanduser() if base else Path.home() / ".cache" / "gpuops") / "bundles"
    where = hashlib.sha256(str(search_dir.resolve()).encode()).hexdigest()[:16]
    return cache_dir / f"{entry}-{where}.json"


def stamp(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def read(cache: Path) -> str | None:
    """The kept script, when every file it came from is as it was; else None."""
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
        if data["files"] and all(stamp(Path(name)) == kept for name, kept in data["files"].items()):
            return str(data["script"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def write(cache: Path, script: str, files: list[Path]) -> None:
    """Keep ``script`` with the stamps of ``files`` (atomically); never fails the command."""
    import tempfile

    try:
        cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {"files": {str(f): stamp(f) for f in [*files, Path(__file__)]}, "script": script}
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=".bundle-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, cache)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass  # no cache is only slower
