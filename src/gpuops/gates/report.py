"""Human output of a gate report, through a rich Console (given by the caller; nothing is imported
or printed at import time). The JSON view is ``GateReport.to_json()``; both read the same dicts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from gpuops.output import SCREEN_WIDTH, brief

if TYPE_CHECKING:
    from rich.console import Console

    from gpuops.gates.evaluate import GateReport

_STYLE = {"blocked": "bold red", "open": "green", "unknown": "yellow", "not_applicable": "dim"}
_HOLDS = {True: "holds", False: "does not hold", None: "not known"}


def _say(console: Console, text: str, style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False)


def _where(gate: dict[str, Any]) -> str:
    return f"{gate['file']}:{gate['line']}"


def render_gate_summary(report: GateReport, console: Console, next_commands: Mapping[str, str] | None = None,
                        detail: bool = False) -> None:
    """Blocked features first, then unknown, then open: one line each (its status, the one reason that
    decides it, the next command), then a count of all gates. ``detail`` (-v): each feature's whole
    reason, with where it is blocked (file:line) and its launch flag, on lines of their own."""
    if not report.known:
        _say(console, f"gates: unknown ({report.reason})", _STYLE["unknown"])
        return
    by_id = {g["id"]: g for g in report.gates}
    order = sorted(report.features.items(), key=lambda kv: {"blocked": 0, "unknown": 1, "open": 2}.get(kv[1]["status"], 3))
    for name, feature in order:
        status = feature["status"]
        if not detail:
            _say(console, feature_line(name, feature, by_id, (next_commands or {}).get(name)), _STYLE.get(status))
            continue
        _say(console, f"{status.upper():8} {name}: {feature['reason']}", _STYLE.get(status))
        if status == "blocked":
            for gate_id in feature["gates"]:
                gate = by_id.get(gate_id)
                if gate and gate["status"] == "blocked" and gate.get("role") in ("runtime", "auto_enable"):
                    _say(console, f"         {gate.get('role')}: {_where(gate)} in {gate['function']} "
                                  f"(admits {', '.join(gate['admits']) or 'none'})")
        if feature.get("flag") and status != "unknown":
            _say(console, f"         flag: {feature['flag']}")
        if (next_commands or {}).get(name):
            _say(console, f"         next: {(next_commands or {})[name]}")
    if detail:
        _say(console, gate_count_line(report))
    else:  # the counts without their breakdown, and where the detail is
        _say(console, brief(gate_count_line(report, pointer="; -v for detail")))
    if report.errors:
        # Each with why (not UTF-8, does not parse, not a regular file, too large): a file the scan
        # could not read is as much a gap in what it knows as one it could not parse.
        files = ", ".join(f"{e['file']} ({e.get('error')})" for e in report.errors[:5])
        _say(console, f"{len(report.errors)} file(s) could not be read or parsed: {files}", _STYLE["unknown"])


def feature_line(name: str, feature: Mapping[str, Any], gates_by_id: Mapping[str, Mapping[str, Any]],
                 next_command: str | None = None, width: int = SCREEN_WIDTH) -> str:
    """``BLOCKED  name: the reason that decides it  -> next command`` in ``width`` characters: the
    reason is shortened to fit, the command never (it is copied as it is), and the reason keeps 20
    characters however long the two are."""
    head = f"{feature['status'].upper():8} {name}: "
    tail = f"  -> {next_command}" if next_command else ""
    room = max(width - len(head) - len(tail), 20)
    return head + brief(deciding_reason(feature, gates_by_id), room) + tail


def deciding_reason(feature: Mapping[str, Any], gates_by_id: Mapping[str, Mapping[str, Any]]) -> str:
    """The one reason an operator acts on, in the order the way out goes: a kernel library or release
    that lacks the feature (an upgrade opens it: the first that has it), then what the host's shape
    does not fit (nothing gpuops can change), then SGLang's own gate (what a patch role opens)."""
    if feature.get("in_effect") is True:
        return "in effect: " + _first_clause(str(feature.get("in_effect_reason") or ""))
    for need in feature.get("kernels") or ():
        if need.get("status") != "blocked":
            continue
        version, reason = need.get("version"), str(need.get("reason") or "")
        if need.get("first") and version:
            # "FlashInfer 0.6.1 cannot build ..." -> FlashInfer: the library's name as the reason spells it
            library = reason.split(f" {version}", 1)[0] if f" {version}" in reason else str(need.get("provider"))
            return f"needs {library} {need['first']}+ (has {version})"
        return _first_clause(reason)
    for fit in feature.get("fits") or ():
        if fit.get("holds") is False:
            return _first_clause(str(fit.get("reason") or ""))
    if feature.get("status") == "blocked":
        for gate_id in feature.get("gates") or ():
            gate = gates_by_id.get(gate_id)
            if gate and gate["status"] == "blocked" and gate.get("role") in ("runtime", "auto_enable"):
                admits = ", ".join(gate["admits"]) or "none"
                return f"SGLang's gate admits {admits} only ({gate['file'].rsplit('/', 1)[-1]}:{gate['line']})"
    reason = _first_clause(str(feature.get("reason") or ""))
    if feature.get("status") == "open" and feature.get("in_effect") is False:
        flag = feature.get("flag")
        return reason + "; not in effect" + (f" (launch flag {flag})" if flag else "")
    return reason


def _first_clause(text: str) -> str:
    return text.split("; ", 1)[0]


def gate_count_line(report: GateReport, pointer: str = " (gpuops inspect gates for detail)") -> str:
    """One line of counts (``GateReport.counts``): blocked, only where the GPU loses something; those
    this host's configuration never reaches; open, with those that skip a path for older or other
    GPUs (issue 43); unknown, and other platforms'."""
    gpu = report.gpu or "this GPU"
    counts = report.counts()
    # The asides say what each count is; `brief` drops them first where the line must fit a screen.
    parts = [f"{counts.blocked} blocked ({gpu} loses something there)"]
    if counts.not_reached:
        parts.append(f"{counts.not_reached} not reached (on this host: its configuration)")
    parts.append(f"{counts.open} open" + (f" ({counts.skips} skip a path for older or other GPUs)" if counts.skips else ""))
    if counts.unknown:
        parts.append(f"{counts.unknown} unknown")
    if counts.not_applicable:
        parts.append(f"{counts.not_applicable} for another platform")
    return (f"{counts.total} capability gates in sglang {report.version or '?'} on {gpu}: "
            + ", ".join(parts) + pointer)


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
        if gate.get("skips"):  # open though its own test shuts the GPU out: the reason says why
            _say(console, f"   loses nothing: {gate['reason']}")
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
