"""The results store: one JSON file per host and run, and an SQLite index for listing.

Layout under the results dir (default ``./results``)::

    <created>_<host>_<suite>_<id>.json     the full result document (the truth)
    index.sqlite                           id, host, suite, created, ok, headline figures, file,
                                           simulated and the stand-in model (for the (sim) marks)

The JSON files are the record; the index is derived and rebuilt from them when it is missing or
does not know a file, so copying result files between machines just works.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tempfile
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from gpuops.bench.simulated import is_simulated, model_label
from gpuops.errors import GpuopsError

INDEX_NAME = "index.sqlite"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_COLUMNS = ("id", "host", "suite", "tool", "created", "ok", "partial", "fingerprint", "sglang_version",
            "output_tokens_per_s", "ttft_ms_p50", "itl_ms_p50", "file", "simulated", "speed_model")


@dataclass(frozen=True)
class ResultEntry:
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

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _COLUMNS}


def _entry_from_result(result: Mapping[str, Any], file: Path) -> ResultEntry:
    summary = result.get("summary") or {}
    ttft = summary.get("ttft_ms") if isinstance(summary.get("ttft_ms"), dict) else {}
    itl = summary.get("itl_ms") if isinstance(summary.get("itl_ms"), dict) else {}
    return ResultEntry(
        id=str(result["id"]), host=str(result.get("host")), suite=str(result.get("suite")),
        tool=result.get("tool"), created=str(result.get("created")), ok=bool(result.get("ok")),
        partial=bool(result.get("partial")), fingerprint=result.get("fingerprint"),
        sglang_version=(result.get("server") or {}).get("version"),
        output_tokens_per_s=summary.get("output_tokens_per_s"),
        ttft_ms_p50=(ttft or {}).get("p50"), itl_ms_p50=(itl or {}).get("p50"), file=file.name,
        simulated=is_simulated(result), speed_model=model_label(result),
    )


class ResultsStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    # -- writing ---------------------------------------------------------------------------

    def save(self, result: Mapping[str, Any]) -> Path:
        """Write the result file atomically and index it; returns the file's path."""
        self.root.mkdir(parents=True, exist_ok=True)
        created = str(result.get("created", "")).replace(":", "").replace("-", "")
        name = "_".join(_SAFE.sub("-", str(part)) for part in (created, result.get("host"), result.get("suite"),
                                                                result["id"])) + ".json"
        path = self.root / name
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(result, handle, indent=1, sort_keys=False, default=str)
                handle.write("\n")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        with closing(self._index()) as db, db:
            self._insert(db, _entry_from_result(result, path))
        return path

    # -- reading ---------------------------------------------------------------------------

    def entries(self) -> list[ResultEntry]:
        if not self.root.is_dir():
            return []
        with closing(self._index()) as db:
            self._sync(db)
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM results ORDER BY created, id").fetchall()
        booleans = ("ok", "partial", "simulated")
        return [ResultEntry(**{c: bool(v) if c in booleans else v for c, v in zip(_COLUMNS, row)})  # type: ignore[arg-type]
                for row in rows]

    def resolve(self, wanted: str) -> ResultEntry:
        """An entry by id or unique id prefix (or file name)."""
        entries = self.entries()
        exact = [e for e in entries if e.id == wanted or e.file == wanted]
        matches = exact or [e for e in entries if e.id.startswith(wanted)]
        if not matches:
            raise GpuopsError(f"results: no result {wanted!r} in {self.root}")
        if len(matches) > 1:
            raise GpuopsError(f"results: {wanted!r} matches {len(matches)} results in {self.root}; "
                              f"give more of the id ({', '.join(e.id for e in matches[:4])})")
        return matches[0]

    def load(self, wanted: str) -> dict[str, Any]:
        entry = self.resolve(wanted)
        path = self.root / entry.file
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise GpuopsError(f"results: {path}: cannot read ({exc})") from None

    # -- index -----------------------------------------------------------------------------

    def _index(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.root / INDEX_NAME, timeout=10)
        columns = [row[1] for row in db.execute("PRAGMA table_info(results)")]
        if columns and tuple(columns) != _COLUMNS:
            # An index written by an older gpuops: it is derived, so rebuild it from the files.
            with db:
                db.execute("DROP TABLE results")
        db.execute(
            "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, host TEXT, suite TEXT, tool TEXT, "
            "created TEXT, ok INTEGER, partial INTEGER, fingerprint TEXT, sglang_version TEXT, "
            "output_tokens_per_s REAL, ttft_ms_p50 REAL, itl_ms_p50 REAL, file TEXT, simulated INTEGER, "
            "speed_model TEXT)")
        return db

    @staticmethod
    def _insert(db: sqlite3.Connection, entry: ResultEntry) -> None:
        values = entry.as_dict()
        db.execute(f"INSERT OR REPLACE INTO results ({', '.join(_COLUMNS)}) VALUES "
                   f"({', '.join('?' for _ in _COLUMNS)})",
                   [int(v) if isinstance(v, bool) else v for v in (values[c] for c in _COLUMNS)])

    def _result_files(self) -> Iterator[Path]:
        return (p for p in sorted(self.root.glob("*.json")) if not p.name.startswith("."))

    def _sync(self, db: sqlite3.Connection) -> None:
        """Index files the index does not know; forget entries whose file is gone."""
        known = {row[0] for row in db.execute("SELECT file FROM results")}
        present = {p.name for p in self._result_files()}
        with db:
            for name in known - present:
                db.execute("DELETE FROM results WHERE file = ?", (name,))
            for name in sorted(present - known):
                try:
                    result = json.loads((self.root / name).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue  # not a result file (or a damaged one): not listed
                if isinstance(result, dict) and result.get("schema", "").startswith("gpuops.bench.result/") \
                        and result.get("id"):
                    self._insert(db, _entry_from_result(result, self.root / name))
