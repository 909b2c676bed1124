"""The memo layer: every result gpuops keeps between runs, behind one interface.

What is kept (``Kind``: GPU facts, no-op plans, the planner's discovery, gate scans, verdicts,
catalog-derived values, bundled helper scripts) is stored and recalled here only: ``key()`` makes
a typed ``Key`` from a kind and every input the result depends on (one fingerprint scheme: sha256 of
the canonical JSON of the inputs, with the format and the kind), ``get``/``put`` read and write an
entry under it, and every entry lives below one directory, ``root()``. One switch: ``GPUOPS_KEEP``
(``off``: nothing is kept or recalled; a path: the root; unset: ``$GPUOPS_CACHE/kept``, else
``~/.cache/gpuops/kept``); removing the root (``clear()``) forgets everything. ``--flush-cache``
(``forget_hosts``) forgets what is kept for the selected hosts, recalls nothing for that run and keeps
what it finds. docs/ARCHITECTURE.md has the table of what each kind's key holds and what it cannot see.

A key made from gpuops' own results includes ``code_digest()`` (or ``package_digest()``): gpuops'
package, the directories roles and templates are looked up in and the libraries planning renders
with, by a stat walk (path, size, mtime, inode; what Python's own .pyc check relies on), so an
upgrade or an edit of gpuops or of a role is a miss. Where the host computes the fingerprint (a gate
scan's tree, the GPU facts' sources) the key carries it as its digest. Entries are JSON, written
atomically, and each names its key and kind, so a torn or moved file is a miss.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import heapq
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from gpuops.role_paths import default_roles_path, shared_templates_dirs
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host

FORMAT = 1
KEEP_ENV = "GPUOPS_KEEP"
OFF = ("off", "0", "no", "false")


class Kind(enum.Enum):
    """What is kept: the directory below the root, and how many entries (per scope) are kept."""

    FACTS = ("facts", 512)         # apply/kept_facts.py: a host's GPU summary, by its host-side fingerprint
    PLANS = ("plans", 256)         # apply/noop_memo.py: an empty plan's report, by every input of planning
    DISCOVERY = ("discovery", 256)  # apply/noop_memo.py: the planner's fact-free pass, by role and variables
    SCANS = ("scans", 3)           # gates/scan_cache.py: a host's gate scans (scope: the host), by tree fingerprint
    JUDGED = ("judged", 256)       # gates/judge_memo.py: a kept scan's verdicts, by the scan and the facts judged
    CATALOG = ("catalog", 16)      # gates/probe.catalog_derived: values made from the catalog file
    BUNDLES = ("bundles", 64)      # shipping/bundle_cache.py: a helper's bundled script, by its files' stamps

    def __init__(self, directory: str, max_entries: int) -> None:
        self.directory = directory
        self.max_entries = max_entries


@frozen
class Key:
    """Where one kept result lives: its kind, the digest of its inputs (or the fingerprint the host
    computed), and a scope (a subdirectory: one host's scans) where a kind keeps entries per scope."""

    kind: Kind
    digest: str
    scope: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind.directory}/{self.scope + '/' if self.scope else ''}{self.digest}"


# Where kept results lived before this layer (each kind its own directory beside the wheels and
# rootfs in the cache; verdicts and catalog values inside scans/): what is still there is never read.
OLD_LAYOUT = ("scans", "plans", "facts", "bundles")


def _cache_base() -> Path:
    base = os.environ.get("GPUOPS_CACHE")
    return Path(base).expanduser() if base else Path.home() / ".cache" / "gpuops"


def root() -> Path | None:
    """The one directory every kept result lives below; None when ``$GPUOPS_KEEP`` is ``off``."""
    value = os.environ.get(KEEP_ENV, "").strip()
    if value.lower() in OFF:
        return None
    if value and value.lower() not in ("on", "1", "yes", "true"):
        return Path(value).expanduser()
    return _cache_base() / "kept"


@functools.lru_cache(maxsize=1)  # once per command: a few stats when there is nothing left to remove
def remove_old_layout(base: Path) -> int:
    """Delete the entries an older gpuops kept at ``base/<kind>/`` (``OLD_LAYOUT``), which this
    layout never reads, so the cache does not keep them for ever: only their ``.json`` entries and
    the directories that leaves empty (nothing else there is gpuops' to remove). Returns how many went."""
    removed = 0
    for name in OLD_LAYOUT:
        old = base / name
        if not old.is_dir() or old.is_symlink():
            continue
        for dirpath, _, filenames in os.walk(old, topdown=False):
            for filename in filenames:
                if filename.endswith(".json"):
                    try:
                        os.unlink(os.path.join(dirpath, filename))
                        removed += 1
                    except OSError:
                        pass
            try:
                os.rmdir(dirpath)  # only when empty
            except OSError:
                pass
    return removed


def directory(kind: Kind, scope: str = "") -> Path | None:
    top = root()
    if top is None:
        return None
    return top / kind.directory / scope if scope else top / kind.directory


def clear() -> None:
    """Forget every kept result (the next command gathers, scans, judges and plans afresh)."""
    import shutil

    top = root()
    if top is not None:
        shutil.rmtree(top, ignore_errors=True)


def forget(kind: Kind, scope: str = "", match: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Remove the entries of ``kind`` in ``scope`` that ``match`` (every one, torn ones too, when
    None; a scope left empty goes with them); the whole entries removed, for what depends on them."""
    where = directory(kind, scope)
    if where is None:
        return []
    try:
        paths = [p for p in where.iterdir() if p.suffix == ".json"]
    except OSError:
        return []
    removed: list[dict[str, Any]] = []
    for path in paths:
        data = _read(path, Key(kind, path.stem, scope))
        if match is not None and (data is None or not match(data)):
            continue
        path.unlink(missing_ok=True)
        if data is not None:
            removed.append(data)
    if scope:
        try:
            where.rmdir()  # only when empty
        except OSError:
            pass
    return removed


def host_identity(host: "Host") -> str:
    """The scope of a host's scans: its inventory name and how it is reached."""
    ident = [host.name, host.address, host.port, host.user, host.connection]
    return hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()[:24]


def forget_hosts(hosts: Iterable["Host"]) -> int:
    """``--flush-cache``: forget every result kept for these hosts, as Ansible's flag clears their
    facts: their GPU facts, no-op plans and discoveries (each entry names its host), their gate
    scans (a scope per host) and the verdicts judged from those scans (each names its scan's
    fingerprint). What is not a host's (the catalog's values, bundled helpers: stamped by local
    files) stays. Returns how many entries went."""
    hosts = list(hosts)
    names = {host.name for host in hosts}
    removed = 0
    fingerprints: set[str] = set()
    for host in hosts:
        scans = forget(Kind.SCANS, host_identity(host))
        fingerprints.update(str(entry.get("fingerprint")) for entry in scans)
        removed += len(scans)
    for kind in (Kind.FACTS, Kind.PLANS, Kind.DISCOVERY):
        removed += len(forget(kind, match=lambda entry: entry.get("host") in names))
    removed += len(forget(Kind.JUDGED, match=lambda entry: entry.get("fingerprint") in fingerprints))
    return removed


def key(kind: Kind, *inputs: Any, scope: str = "") -> Key | None:
    """The key of a result that depends on exactly ``inputs`` (plain data, dataclasses, sets); None
    when they cannot be digested (then nothing is kept or recalled)."""
    digest = digest_of(FORMAT, kind.name, *inputs)
    return None if digest is None else Key(kind, digest, scope)


def get(key: Key) -> dict[str, Any] | None:
    """The entry kept under ``key``; None when keeping is off, or it is absent, torn or not that key's."""
    where = directory(key.kind, key.scope)
    return None if where is None else _read(where / f"{key.digest}.json", key)


def put(key: Key, entry: dict[str, Any]) -> None:
    """Keep ``entry`` under ``key`` (atomically; beyond the kind's ``max_entries`` the oldest of
    the scope go); never fails the command. A no-op when keeping is off."""
    where = directory(key.kind, key.scope)
    if where is not None:
        _write(where, key, entry)
        if root() == _cache_base() / "kept":  # the default place: the old one was beside it
            remove_old_layout(_cache_base())


def touch(key: Key) -> None:
    """Mark a kept entry as the newest of its scope (it is pruned last). Its scope's directory is
    stamped too, as writing an entry stamps it: ``keys_of_other_scopes`` relies on a directory
    being at least as new as its newest entry."""
    where = directory(key.kind, key.scope)
    if where is not None:
        try:
            os.utime(where / f"{key.digest}.json")
            os.utime(where)
        except OSError:
            pass


def keys(kind: Kind, scope: str = "") -> list[Key]:
    """The keys of a scope's entries, newest first; nothing is read (``get`` reads one)."""
    where = directory(kind, scope)
    if where is None:
        return []
    return [Key(kind, digest, scope) for _, digest in sorted(_entries(where), reverse=True)]


def newest(kind: Kind, scope: str = "", limit: int = 0) -> list[tuple[Key, dict[str, Any]]]:
    """The whole entries of a scope, newest first (at most ``limit`` when given)."""
    found: list[tuple[Key, dict[str, Any]]] = []
    for entry_key in keys(kind, scope):
        if limit and len(found) >= limit:
            break
        data = get(entry_key)
        if data is not None:
            found.append((entry_key, data))
    return found


def discard(key: Key) -> None:
    """Remove the entry kept under ``key`` (one found unusable); never fails the command."""
    where = directory(key.kind, key.scope)
    if where is not None:
        try:
            (where / f"{key.digest}.json").unlink(missing_ok=True)
        except OSError:
            pass


def exists(key: Key) -> bool:
    """Whether an entry is kept under ``key`` (not read: a torn one counts)."""
    where = directory(key.kind, key.scope)
    return where is not None and (where / f"{key.digest}.json").is_file()


def keys_of_other_scopes(kind: Kind, scope: str) -> Iterator[Key]:
    """The keys of every scope of ``kind`` but ``scope``, newest entry first; nothing is read.

    Lazily: a scope's directory is listed only once its entries may come next. A directory is at
    least as new as its newest entry (an entry is written by a rename into it, which stamps it, and
    ``touch`` stamps both), so the directories are taken newest first and listed while the newest
    entry not yet given could be in them. A caller that takes the newest few (the scans offered to
    a host) lists a few directories however many hosts the cache keeps; before this, every one was
    listed, for every host of every command (~9 ms for 333 scopes, on the critical path of inspect)."""
    top = directory(kind)
    if top is None:
        return
    scopes = sorted(((mtime, name) for mtime, name in _subdirectories(top) if name != scope), reverse=True)
    pending: list[tuple[int, str, str]] = []  # a heap of (-mtime, scope, digest): the entries listed, not yet given
    listed = 0
    while True:
        while listed < len(scopes) and (not pending or scopes[listed][0] >= -pending[0][0]):
            name = scopes[listed][1]
            for mtime, digest in _entries(top / name):
                heapq.heappush(pending, (-mtime, name, digest))
            listed += 1
        if not pending:
            return
        _, name, digest = heapq.heappop(pending)
        yield Key(kind, digest, name)


def _subdirectories(top: Path) -> list[tuple[int, str]]:
    """(mtime, name) of each directory in ``top``; none when it cannot be read."""
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(top) as listing:
            for entry in listing:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
                except OSError:  # removed meanwhile
                    continue
    except OSError:
        pass
    return found


def _entries(where: Path) -> list[tuple[int, str]]:
    """(mtime, digest) of each entry in a scope's directory; none when it is gone (pruned meanwhile)."""
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(where) as listing:
            for entry in listing:
                if entry.name.endswith(".json") and not entry.name.startswith("."):
                    try:
                        found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name[:-len(".json")]))
                    except OSError:
                        continue
    except OSError:
        pass
    return found


def _read(path: Path, key: Key) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key.digest
            or data.get("kind") != key.kind.directory):
        return None
    return data


def _write(where: Path, key: Key, entry: dict[str, Any]) -> None:
    import tempfile

    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".memo-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({**entry, "format": FORMAT, "key": key.digest, "kind": key.kind.directory}, fh,
                          separators=(",", ":"))
            os.replace(tmp, where / f"{key.digest}.json")  # a concurrent reader sees the old entry or the new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        entries = sorted(((p.stat().st_mtime_ns, p) for p in where.glob("*.json")), reverse=True)
        for _, old in entries[key.kind.max_entries:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


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
