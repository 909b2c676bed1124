"""The results store: one JSON file per host and run, and an SQLite index for listing.

Layout under the results dir (default ``./results``)::

    <created>_<host>_<suite>_<id>.json     the full result document (the truth)
    index.sqlite                           id, host, suite, created, ok, headline figures, file,
                                           simulated and the stand-in model (for the (sim) marks)

The JSON files are the record; the index is derived and rebuilt from them when it is missing, does
not know a file, knows an older version of one (size and mtime), is from another schema or cannot
be read as a database, so copying result files between machines just works. Every file is read as
untrusted (``result_file``): one that is not a readable result is listed in ``bad`` with why, and
the rest are served; what the store had to do on the way (an index rebuilt, figures read as
missing) is in ``notes``. The commands print both, one line each, on stderr.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sqlite3
import stat
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Iterator, Sequence

from gpuops.bench.record import JSONObject, KeptTrace, ResultDocument, number
from gpuops.bench.result_file import BadResult, ResultFile, clean_figures, read_result
from gpuops.bench.simulated import is_simulated, model_label
from gpuops.errors import GpuopsError
from gpuops.frozen import frozen

INDEX_NAME = "index.sqlite"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_COLUMNS = ("id", "host", "suite", "tool", "created", "ok", "partial", "fingerprint", "sglang_version",
            "output_tokens_per_s", "ttft_ms_p50", "itl_ms_p50", "file", "simulated", "speed_model", "flagged")
# The index also keeps each file's size and mtime: a file changed under the same name is read again.
_INDEX_COLUMNS = _COLUMNS + ("stamp",)
# Bumped whenever what the index derives from a file changes (2: the flags on figures read as
# missing, the stamp): an index of another version is rebuilt from the files.
_INDEX_VERSION = 2


@frozen
class BadFile:
    """A file in the results folder that is not a result gpuops can read, and why."""

    name: str
    why: str

    def line(self) -> str:
        return f"results: skipped {self.name}: {self.why}"


@frozen
class ResultEntry:
    """One stored result as the index lists it: host, suite, when, its configuration's fingerprint, the headline
    figures, and the file that holds the whole document."""

    id: str
    host: str
    suite: str
    tool: str | None
    created: str
    ok: bool
    partial: bool
    fingerprint: str | None
    sglang_version: str | None
    output_tokens_per_s: float | None
    ttft_ms_p50: float | None
    itl_ms_p50: float | None
    file: str
    simulated: bool = False
    speed_model: str | None = None  # the stand-in model's label when simulated
    flagged: str | None = None  # figures read as missing (NaN, infinite, absurd), in words

    def as_dict(self) -> dict[str, str | float | bool | None]:
        return {name: getattr(self, name) for name in _COLUMNS}

    @classmethod
    def from_row(cls, row: Sequence[object]) -> ResultEntry:
        """An entry from its index row (``_COLUMNS``, in order), as SQLite gives it back."""
        values = dict(zip(_COLUMNS, row))

        def text(name: str) -> str:
            return str(values[name])

        def optional(name: str) -> str | None:
            value = values[name]
            return None if value is None else str(value)

        return cls(id=text("id"), host=text("host"), suite=text("suite"), tool=optional("tool"),
                   created=text("created"), ok=bool(values["ok"]), partial=bool(values["partial"]),
                   fingerprint=optional("fingerprint"), sglang_version=optional("sglang_version"),
                   output_tokens_per_s=number(values["output_tokens_per_s"]), ttft_ms_p50=number(values["ttft_ms_p50"]),
                   itl_ms_p50=number(values["itl_ms_p50"]), file=text("file"), simulated=bool(values["simulated"]),
                   speed_model=optional("speed_model"), flagged=optional("flagged"))


def _entry_from_result(result: ResultDocument, file: Path, flagged: tuple[str, ...] = ()) -> ResultEntry:
    """The index's row of a result (one ``result_file`` checked: every field here has its type)."""
    summary = result.get("summary") or {}
    return ResultEntry(
        id=str(result["id"]), host=str(result.get("host")), suite=str(result.get("suite")),
        tool=result.get("tool"), created=str(result.get("created")), ok=bool(result.get("ok")),
        partial=bool(result.get("partial")), fingerprint=result.get("fingerprint"),
        sglang_version=(result.get("server") or {}).get("version"),
        output_tokens_per_s=number(summary, "output_tokens_per_s"),
        ttft_ms_p50=number(summary, "ttft_ms", "p50"), itl_ms_p50=number(summary, "itl_ms", "p50"), file=file.name,
        simulated=is_simulated(result), speed_model=model_label(result), flagged=_flag_text(flagged),
    )


def _flag_text(flagged: tuple[str, ...]) -> str | None:
    if not flagged:
        return None
    more = f" and {len(flagged) - 3} more" if len(flagged) > 3 else ""
    return ", ".join(flagged[:3]) + more + ": read as missing (-)"


def _stamp(path: Path) -> str | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return f"{info.st_size}:{info.st_mtime_ns}"


class ResultsStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.bad: dict[str, BadFile] = {}  # file name -> why it is not served (from the last listing)
        self.notes: dict[str, None] = {}  # what the store did on the way, once each, in order

    # -- writing ---------------------------------------------------------------------------

    def save(self, result: ResultDocument) -> Path:
        """Write the result file atomically (complete and on disk before it is named) and index it;
        returns the file's path. A figure NaN, infinite or absurd is stored as missing and said in
        ``notes``; a disk that cannot take the file is one GpuopsError saying nothing was stored."""
        _private_dir(self.root)
        created = str(result.get("created", "")).replace(":", "").replace("-", "")
        name = "_".join(_SAFE.sub("-", str(part)) for part in (created, result.get("host"), result.get("suite"),
                                                                result["id"])) + ".json"
        path = self.root / name
        document: ResultDocument = json.loads(json.dumps(result, default=str))  # the caller's copy stays as measured
        rejected = clean_figures(document)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)  # 0600: as tight as any result
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=1, sort_keys=False)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            raise GpuopsError(f"results: result {result['id']} of {result.get('host')} not saved in {self.root}: "
                              f"{_os_error(exc)}; nothing of it was stored (its partial file removed)") from None
        except BaseException:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            raise
        if rejected:
            self.notes[f"results: {name}: stored as missing, not as measured: {_flag_text(tuple(rejected))}"] = None
        try:
            with closing(self._index()) as db, db:
                self._insert(db, _entry_from_result(document, path), _stamp(path))
        except sqlite3.DatabaseError as exc:
            # The file is the record and it is written; the index is rebuilt from it when next read.
            self.notes[f"results: {self.root / INDEX_NAME} not updated ({exc}); rebuilt when next read"] = None
        return path

    def save_traces(self, result_id: str, files: Sequence[JSONObject]) -> list[KeptTrace]:
        """Raw traces a profile brought home (``--fetch-traces``: base64 in its frames), written under
        ``traces/<result id>/``; (file, bytes, path or why not) of each, for the result to name."""
        import base64
        import binascii

        folder = self.root / "traces" / _SAFE.sub("-", result_id)
        kept: list[KeptTrace] = []
        for record in files:
            name = _SAFE.sub("-", os.path.basename(str(record.get("file") or "trace")))[:200] or "trace"
            try:
                data = base64.b64decode(str(record.get("base64") or ""), validate=True)
            except (binascii.Error, ValueError):
                kept.append({"file": name, "bytes": None, "path": None, "error": "not base64 as sent"})
                continue
            path = folder / name
            tmp = None
            try:
                _private_dir(folder)
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(tmp, path)
            except OSError as exc:  # a full disk: this trace is not kept, and the result says so
                if tmp is not None and os.path.exists(tmp):
                    os.unlink(tmp)
                kept.append({"file": name, "bytes": len(data), "path": None,
                             "error": f"not saved in {folder}: {_os_error(exc)}"})
                continue
            kept.append({"file": name, "bytes": len(data), "path": str(path)})
        return kept

    # -- reading ---------------------------------------------------------------------------

    def entries(self) -> list[ResultEntry]:
        """Every readable result, oldest first; the files that are not are in ``bad`` after it."""
        self.bad = {}
        if not self.root.is_dir():
            return []
        index = self.root / INDEX_NAME
        try:
            rows = self._listed(index)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                # Another gpuops writes it now: leave it be, list from the files this time.
                self.notes[f"results: {index} is busy ({exc}); listed from the result files"] = None
                rows = self._listed(":memory:")
            else:
                self.notes[f"results: {index} could not be read ({exc}); rebuilt from the result files"] = None
                self.bad = {}
                try:
                    _remove_index(index)
                    rows = self._listed(index)
                except (OSError, sqlite3.DatabaseError) as again:  # a read-only folder, say
                    self.notes[f"results: {index} could not be rebuilt ({again}); listed from the result files"] = None
                    self.bad = {}
                    rows = self._listed(":memory:")
        return [ResultEntry.from_row(row) for row in rows]

    def _listed(self, index: Path | str) -> list[tuple[object, ...]]:
        with closing(self._index(index)) as db:
            self._sync(db)
            return db.execute(f"SELECT {', '.join(_COLUMNS)} FROM results ORDER BY created, id").fetchall()

    def resolve(self, wanted: str) -> ResultEntry:
        """An entry by id or unique id prefix (or file name)."""
        entries = self.entries()
        exact = [e for e in entries if e.id == wanted or e.file == wanted]
        matches = exact or [e for e in entries if e.id.startswith(wanted)]
        if not matches:
            # A file named for that id (``..._<id>.json``) that cannot be read: say so, and why.
            named = [b for b in self.bad.values() if wanted and (b.name == wanted or _file_id(b.name).startswith(wanted))]
            if len(named) == 1:
                raise GpuopsError(f"results: {named[0].name}: {named[0].why}")
            unread = f"; {len(self.bad)} file(s) there could not be read" if self.bad else ""
            raise GpuopsError(f"results: no result {wanted!r} in {self.root}{unread}")
        if len(matches) > 1:
            raise GpuopsError(f"results: {wanted!r} matches {len(matches)} results in {self.root}; "
                              f"give more of the id ({', '.join(e.id for e in matches[:4])})")
        return matches[0]

    def load(self, wanted: str) -> ResultDocument:
        """The stored document of one result (checked and cleaned as ``result_file`` reads it)."""
        entry = self.resolve(wanted)
        loaded = self.read(entry.file)
        return loaded.document

    def read(self, name: str) -> ResultFile:
        """The result file ``name`` of the folder, read again (it may have changed since listed)."""
        try:
            loaded = read_result(self.root / name)
        except BadResult as exc:
            raise GpuopsError(f"results: {name}: {exc}") from None
        if loaded.flagged:
            self.notes[f"results: {name}: {_flag_text(loaded.flagged)}"] = None
        return loaded

    def lines(self) -> list[str]:
        """One line for each file not served and each thing done on the way (for stderr)."""
        return [b.line() for b in self.bad.values()] + list(self.notes)

    # -- index -----------------------------------------------------------------------------

    def _index(self, where: Path | str | None = None) -> sqlite3.Connection:
        where = self.root / INDEX_NAME if where is None else where
        if isinstance(where, Path) and where.exists() and not stat.S_ISREG(where.stat().st_mode):
            # SQLite would block for good on a FIFO and read a device: not an index, so rebuilt.
            raise sqlite3.DatabaseError("not a regular file")
        new = isinstance(where, Path) and not where.exists()
        db = sqlite3.connect(where, timeout=10)
        try:
            if new and isinstance(where, Path):
                os.chmod(where, 0o600)  # as tight as the results it lists (SQLite's side files follow it)
            columns = [row[1] for row in db.execute("PRAGMA table_info(results)")]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if columns and (tuple(columns) != _INDEX_COLUMNS or version != _INDEX_VERSION):
                # An index written by another gpuops: it is derived, so rebuild it from the files.
                with db:
                    db.execute("DROP TABLE results")
            db.execute(f"PRAGMA user_version = {_INDEX_VERSION}")
            db.execute(
                "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, host TEXT, suite TEXT, tool TEXT, "
                "created TEXT, ok INTEGER, partial INTEGER, fingerprint TEXT, sglang_version TEXT, "
                "output_tokens_per_s REAL, ttft_ms_p50 REAL, itl_ms_p50 REAL, file TEXT, simulated INTEGER, "
                "speed_model TEXT, flagged TEXT, stamp TEXT)")
        except BaseException:
            db.close()
            raise
        return db

    @staticmethod
    def _insert(db: sqlite3.Connection, entry: ResultEntry, stamp: str | None) -> None:
        values = dict(entry.as_dict(), stamp=stamp)
        db.execute("DELETE FROM results WHERE file = ?", (entry.file,))  # the same file under another id
        db.execute(f"INSERT OR REPLACE INTO results ({', '.join(_INDEX_COLUMNS)}) VALUES "
                   f"({', '.join('?' for _ in _INDEX_COLUMNS)})",
                   [int(v) if isinstance(v, bool) else v for v in (values[c] for c in _INDEX_COLUMNS)])

    def _result_files(self) -> Iterator[Path]:
        return (p for p in sorted(self.root.glob("*.json")) if not p.name.startswith("."))

    def _sync(self, db: sqlite3.Connection) -> None:
        """Index the files the index does not know, or knows an older version of; forget entries
        whose file is gone or no longer reads; note every file that is not a readable result."""
        known = dict(db.execute("SELECT file, stamp FROM results").fetchall())
        present = {p.name: _stamp(p) for p in self._result_files()}
        with db:
            for name in set(known) - set(present):
                db.execute("DELETE FROM results WHERE file = ?", (name,))
            for name, stamp in sorted(present.items()):
                if name in known and known[name] == stamp and stamp is not None:
                    continue
                try:
                    loaded = read_result(self.root / name)
                except BadResult as exc:
                    db.execute("DELETE FROM results WHERE file = ?", (name,))
                    self.bad[name] = BadFile(name, str(exc))
                    continue
                self._insert(db, _entry_from_result(loaded.document, self.root / name, loaded.flagged), stamp)


def _private_dir(folder: Path) -> None:
    """``folder`` made if need be, readable by its owner only (a folder that was there keeps its mode)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)


def _os_error(exc: OSError) -> str:
    """An OSError as its cause: ``ENOSPC: No space left on device``."""
    return f"{errno.errorcode.get(exc.errno or 0, 'error')}: {exc.strerror or exc}"


def _file_id(name: str) -> str:
    """The id a result file's name ends with (``<created>_<host>_<suite>_<id>.json``)."""
    return name.rsplit(".", 1)[0].rsplit("_", 1)[-1]


def _remove_index(index: Path) -> None:
    """The derived index and SQLite's side files, gone (a damaged one is rebuilt from the files)."""
    for path in (index, index.with_name(index.name + "-journal"), index.with_name(index.name + "-wal"),
                 index.with_name(index.name + "-shm")):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
