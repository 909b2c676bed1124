"""Results of gpuops' pure local steps, kept on the client by the digest of all their inputs.

Used where a step is a pure function of gpuops' own code and of inputs that can be digested
exactly: a no-op plan (``apply/noop_memo.py``) and the judging of a gate scan (``gates/judge_memo.py``).
Every key includes ``code_digest()``: gpuops' package, the directories roles and templates are
looked up in and the libraries planning renders with, by a stat walk (path, size, mtime, inode;
what Python's own .pyc check relies on), so an upgrade or an edit of gpuops or of a role is a miss.
Entries are JSON, written atomically, and each names its key, so a torn or moved file is a miss.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

FORMAT = 1


OFF = ("off", "0", "no", "false")
# One switch for every kept result (scans and what is kept beside them, no-op plans, GPU facts):
# ``GPUOPS_KEEP=off`` keeps and recalls nothing; each kind's own variable still picks its directory.
KEEP_ENV = "GPUOPS_KEEP"


def memo_dir(env: str, name: str) -> Path | None:
    """None when ``$GPUOPS_KEEP`` or ``$<env>`` is ``off``; else ``$<env>``, else
    ``$GPUOPS_CACHE/<name>``, else ``~/.cache/gpuops/<name>``."""
    if os.environ.get(KEEP_ENV, "").strip().lower() in OFF:
        return None
    value = os.environ.get(env, "").strip()
    if value.lower() in OFF:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("GPUOPS_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "gpuops") / name


def _walk(top: Path, digest: Any) -> None:
    """Every file below ``top`` (bytecode caches aside) by path, size, mtime and inode. Symlinked
    directories are followed, as ``load_role`` and jinja's loader follow them (a role linked into
    ``roles/``), each real directory once so a link cycle ends."""
    if not top.is_dir():
        digest.update(f"\nabsent {top}".encode())
        return
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        try:
            info = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (info.st_dev, info.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            try:
                info = os.stat(path)
            except OSError:
                continue
            digest.update(f"\n{path}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ino}".encode("utf-8", "surrogateescape"))


@functools.lru_cache(maxsize=1)  # one walk per command, however many hosts
def package_digest() -> str:
    """gpuops' own code (its package directory, by the stat walk) and the python running it: what a
    result gpuops' parsers made depends on, wherever the command runs from (no roles, no cwd)."""
    digest = hashlib.sha256()
    digest.update(json.dumps([FORMAT, sys.version]).encode())
    _walk(Path(__file__).resolve().parent, digest)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)  # one walk per command, however many hosts
def code_digest() -> str:
    """gpuops' code, the directories roles and templates are looked up in (some relative to the
    working directory), and the libraries planning renders and reads with."""
    import importlib.util

    from gpuops.plan.role_paths import default_roles_path, shared_templates_dirs

    digest = hashlib.sha256()
    digest.update(json.dumps([FORMAT, package_digest(), os.environ.get("GPUOPS_ROLES_PATH", "")]).encode())
    for top in [*default_roles_path(), *shared_templates_dirs()]:
        _walk(top, digest)
    for library in ("jinja2", "markupsafe", "yaml"):
        spec = importlib.util.find_spec(library)  # finds without importing it
        origin = spec.origin if spec is not None else None
        if origin:
            info = os.stat(origin)
            digest.update(f"\n{library}\0{origin}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ino}".encode())
    return digest.hexdigest()


def jsonable(value: Any) -> Any:
    """``json.dumps``' default for digests: dataclasses by field, sets sorted, anything else its
    repr. A default repr (it carries the object's id) only makes a miss; a repr that leaves out part
    of an object's state would make a wrong hit, so what is digested must be plain data, dataclasses
    and sets (every field of the facts and variables digested today is)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__dataclass__": type(value).__name__, **{f.name: getattr(value, f.name) for f in dataclasses.fields(value)}}
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, value))
    return repr(value)


def digest_of(*parts: Any) -> str | None:
    """sha256 of ``parts`` as canonical JSON; None when they cannot be written as JSON."""
    try:
        blob = json.dumps(parts, sort_keys=True, default=jsonable)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(blob.encode("utf-8", "surrogateescape")).hexdigest()


def read_entry(directory: Path, key: str, kind: str) -> dict[str, Any] | None:
    """The entry kept under ``key``, when it is whole and says it is that key's, of that kind."""
    try:
        data = json.loads((directory / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key or data.get("kind") != kind:
        return None
    return data


def write_entry(directory: Path, key: str, entry: dict[str, Any], max_entries: int) -> None:
    """Keep ``entry`` (atomically; the oldest beyond ``max_entries`` go); never fails the command."""
    import tempfile

    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".memo-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({**entry, "format": FORMAT, "key": key}, fh, separators=(",", ":"))
            os.replace(tmp, directory / f"{key}.json")  # a concurrent reader sees the old entry or the new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        entries = sorted(((p.stat().st_mtime_ns, p) for p in directory.glob("*.json")), reverse=True)
        for _, old in entries[max_entries:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
