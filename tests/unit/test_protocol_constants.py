"""The apply host protocol's statuses, events, modes and run kinds are named by ``remote/host_protocol.py``'s
constants everywhere else: a bare ``"rolled_back"`` that comes back in a comparison, a result's
``status`` or a journal ``event`` fails here, naming file and line (issue 28).

Read with ``ast``, like test_no_private_patching: only string constants count (comments, docstrings
and prose inside f-strings do not). Two rules:
- a name only the protocol uses (``rolled_back``, ``rollback_failed``, ...) anywhere, as any string;
- a common word that is also a status or event (``finished``, ``unchanged``, ``refused``, ...) where it
  is one: the value of a ``"status"``/``"event"``/``"last_event"``/``"outcome"`` key, the event
  written by ``run.event(...)``, or compared (``==``, ``in``) with something named status, event(s),
  last_event or outcome.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpuops.remote import host_protocol as hp

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuops"
PROTOCOL = SRC / "remote" / "host_protocol.py"

NAMES = set(hp.RESULT_STATUSES) | set(hp.JOURNAL_EVENTS) | set(hp.PROGRESS_EVENTS) | set(hp.MODES) | set(hp.RUN_KINDS)
# Words nothing but the protocol says: refused as a string anywhere.
DISTINCT = {n for n in NAMES if "_" in n}
STATUS_KEYS = {"status", "event", "last_event", "outcome", "mode", "for_mode", "kind", "role"}
STATUS_WORDS = ("status", "event", "outcome", "mode", "kind")
# Where the protocol is spoken; elsewhere (gates' verdicts, bench samples) the same words mean other things.
PROTOCOL_DIRS = ("apply", "remote", "tune", "commands")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _names_status(node: ast.AST) -> bool:
    """Whether an expression reads something named like a status (``r["outcome"]``, ``report.status``)."""
    for sub in ast.walk(node):
        text = (sub.attr if isinstance(sub, ast.Attribute) else sub.id if isinstance(sub, ast.Name)
                else sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str) else "")
        if any(word in text for word in STATUS_WORDS):
            return True
    return False


def _strings(node: ast.AST) -> list[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _strings(e)]
    return []


def bare_statuses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in DISTINCT \
                and id(node) not in docs and id(node) not in in_fstring:
            found.append(node)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value in STATUS_KEYS:
                    found += [c for c in _strings(value) if c.value in NAMES]
                    if isinstance(value, ast.IfExp):
                        found += [c for c in _strings(value.body) + _strings(value.orelse) if c.value in NAMES]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "event" \
                and node.args:
            found += [c for c in _strings(node.args[0]) if c.value in NAMES]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_status(side) for side in sides):
                found += [c for side in sides for c in _strings(side) if c.value in NAMES]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith" \
                and _names_status(node.func.value):
            found += [c for a in node.args for c in _strings(a) if c.value in NAMES]
        if isinstance(node, ast.Call):  # HostReport(status="refused")
            found += [c for k in node.keywords if k.arg in STATUS_KEYS for c in _strings(k.value) if c.value in NAMES]
        elif isinstance(node, ast.Assign) and any(_names_status(t) for t in node.targets):
            found += [c for c in _strings(node.value) if c.value in NAMES]  # report.status, x = "unchanged", y
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(c.value in DISTINCT for c in _strings(node)):
            found += [c for c in _strings(node) if c.value in NAMES]  # ("rolled_back", "refused")
        elif isinstance(node, ast.IfExp) and any(c.value in DISTINCT for c in _strings(node.body) + _strings(node.orelse)):
            found += [c for c in _strings(node.body) + _strings(node.orelse) if c.value in NAMES]
    rel = path.relative_to(SRC.parent) if path.is_relative_to(SRC.parent) else path
    return sorted({f"{rel}:{c.lineno}: {c.value!r}" for c in found})


def _speaks_protocol(path: Path) -> bool:
    rel = path.relative_to(SRC)
    return rel.parts[0] in PROTOCOL_DIRS and not rel.name.startswith("bench_")  # bench: HTTP stream events


def test_protocol_statuses_are_named_by_the_constants_everywhere() -> None:
    offenders = [line for path in sorted(SRC.rglob("*.py")) if path != PROTOCOL for line in bare_statuses(path)
                 if _speaks_protocol(path) or any(f"'{n}'" in line for n in DISTINCT)]
    assert not offenders, "use gpuops.remote.host_protocol's constants:\n" + "\n".join(offenders)


def test_the_check_finds_each_kind_of_bare_status(tmp_path: Path) -> None:
    """The rules above catch what they say (a check that finds nothing would pass anything)."""
    sample = tmp_path / "sample.py"
    cases = {
        'x = "rolled_back"': 1,
        'r = {"ok": True, "status": "finished"}': 1,
        'r = {"status": "rolled_back" if a else "refused"}': 2,
        'run.event("started", pid=1)': 1,
        'ok = report.status == "unchanged"': 1,
        'ok = run["last_event"] in ("finished", "error")': 2,
        'ok = r["outcome"].startswith("unknown")': 1,
        'ok = name == "finished"': 0,  # a common word, not compared with a status
        'r = HostReport(status="refused")': 1,
        'report.status, report.run_id = "unchanged", run_id': 1,
        'known = ("rolled_back", "refused")': 2,
        's = "rollback_failed" if a else "refused"': 2,
        'p = {"mode": "journal"}': 1,
        'ok = mode != "journal"': 1,
        'x = f"rolled back {y}"': 0,
        'undone = run.get("kind") == "rollback"': 1,  # a run kind
        'run.journal_started(kind="rollback", target=t)': 1,
        'manifest = {"kind": "rollback", "target": t}': 1,
        'meta = {"role": "rollback", "user": u}': 1,
        'ok = change["kind"] == "template"': 0,  # a change's kind: no run kind
    }
    for code, count in cases.items():
        sample.write_text(code + "\n", encoding="utf-8")
        assert len(bare_statuses(sample)) == count, code
