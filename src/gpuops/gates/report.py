"""Human output of a gate report, through a rich Console (given by the caller; nothing is imported
or printed at import time). The JSON view is ``GateReport.to_json()``; both read the same dicts.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from rich.console import Console

    from gpuops.gates.evaluate import GateReport

_STYLE = {"blocked": "bold red", "open": "green", "unknown": "yellow", "not_applicable": "dim"}
_HOLDS = {True: "holds", False: "does not hold", None: "not known"}


def _say(console: Console, text: str, style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False)


def _where(gate: dict[str, Any]) -> str:
    return f"{gate['file']}:{gate['line']}"


def render_gate_summary(report: GateReport, console: Console) -> None:
    """Blocked features first, with where they are blocked (file:line), then a count of all gates."""
    if not report.known:
        _say(console, f"gates: unknown ({report.reason})", _STYLE["unknown"])
        return
    by_id = {g["id"]: g for g in report.gates}
    order = sorted(report.features.items(), key=lambda kv: {"blocked": 0, "unknown": 1, "open": 2}.get(kv[1]["status"], 3))
    for name, feature in order:
        status = feature["status"]
        _say(console, f"{status.upper():8} {name}: {feature['reason']}", _STYLE.get(status))
        if status == "blocked":
            for gate_id in feature["gates"]:
                gate = by_id.get(gate_id)
                if gate and gate["status"] == "blocked" and gate.get("role") in ("runtime", "auto_enable"):
                    _say(console, f"         {gate.get('role')}: {_where(gate)} in {gate['function']} "
                                  f"(admits {', '.join(gate['admits']) or 'none'})")
        if feature.get("flag") and status != "unknown":
            _say(console, f"         flag: {feature['flag']}")
    _say(console, gate_count_line(report))
    if report.errors:
        # Each with why (not UTF-8, does not parse, not a regular file, too large): a file the scan
        # could not read is as much a gap in what it knows as one it could not parse.
        files = ", ".join(f"{e['file']} ({e.get('error')})" for e in report.errors[:5])
        _say(console, f"{len(report.errors)} file(s) could not be read or parsed: {files}", _STYLE["unknown"])


def gate_count_line(report: GateReport) -> str:
    """One line of counts: what "blocked" costs (shut out, or sent to its own path), open,
    unknown, other platforms' gates, and those this host's configuration never reaches."""
    gpu = report.gpu or "this GPU"
    counts = Counter(g["status"] for g in report.gates)
    blocked = [g for g in report.gates if g["status"] == "blocked"]
    own = sum(1 for g in blocked if g.get("alternative"))
    unreached = sum(1 for g in blocked if not g.get("alternative") and g.get("unreachable"))
    shut = len(blocked) - own - unreached
    parts = [f"{len(blocked)} blocked ({shut} shut {gpu} out, {own} send it to its own path"
             + (f", {unreached} not reached on this host" if unreached else "") + ")",
             f"{counts.get('open', 0)} open", f"{counts.get('unknown', 0)} unknown"]
    if counts.get("not_applicable"):
        parts.append(f"{counts['not_applicable']} for another platform")
    return (f"{len(report.gates)} capability gates in sglang {report.version or '?'} on {gpu}: "
            + ", ".join(parts) + " (gpuops inspect gates for detail)")


def render_gate_detail(report: GateReport, console: Console, feature: str | None = None, show_all: bool = False) -> None:
    """Every catalogued feature (or just ``feature``) with each gate on its path, its clauses and
    its source excerpt; ``show_all`` adds every other capability gate the scan found."""
    if not report.known:
        _say(console, f"gates: unknown ({report.reason})", _STYLE["unknown"])
        return
    by_id = {g["id"]: g for g in report.gates}
    names = [feature] if feature else list(report.features)
    for name in names:
        info = report.features.get(name)
        if info is None:
            _say(console, f"no feature {name!r} in the catalog (known: {', '.join(report.features)})", _STYLE["unknown"])
            continue
        _say(console, f"== {name}: {info['status'].upper()}", _STYLE.get(info["status"]))
        _say(console, f"   {info['reason']}")
        if info.get("flag"):
            _say(console, f"   launch flag: {info['flag']}")
        _render_gates(console, (by_id[i] for i in info["gates"] if i in by_id))
    if show_all:
        others = [g for g in report.gates if not g.get("feature")]
        _say(console, f"== other capability gates ({len(others)})")
        _render_gates(console, others)


def _render_gates(console: Console, gates: Iterable[dict[str, Any]]) -> None:
    for gate in gates:
        role = f"[{gate['role']}] " if gate.get("role") else ""
        _say(console, f"-- {role}{_where(gate)} {gate['function']}: {gate['status']}", _STYLE.get(gate["status"]))
        line = f"   admits: {', '.join(gate['admits']) or 'none'}"
        if gate["status"] in ("unknown", "not_applicable"):
            line += f"; {gate['reason']}"
        _say(console, line)
        if gate.get("alternative"):
            _say(console, f"   its own path: {gate['alternative']}")
        if gate.get("unreachable"):
            _say(console, f"   not reached here: {gate['unreachable']}")
        if gate.get("meaning"):
            _say(console, f"   what it is: {gate['meaning']}")
        for clause in gate.get("clauses") or ():
            holds = clause.get("holds")
            mark = "" if holds is None and "holds" not in clause else f" ({_HOLDS.get(holds, 'not known')})"
            _say(console, f"   and: {clause['text']}{mark}")
        excerpt = gate.get("excerpt")
        if excerpt:
            for line in str(excerpt).splitlines():
                _say(console, f"   | {line}")
