"""Human output for apply/rollback/history: per-host changes, diffs, warnings, an Ansible-like recap."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import click

from gpuops.apply.host_report import HostReport
from gpuops.output import safe_text
from gpuops.remote.host_protocol import KIND_ROLLBACK, STATUS_FINISHED, STATUS_UNKNOWN


Say = Callable[..., None]


def _sayer(echo: Callable[[str], None], color: bool) -> Say:
    """One line out: host text in it (paths, errors, log tails, warnings) through ``safe_text``,
    then gpuops' own colour. With colour, ``echo`` writes around the stream guard
    (``output.echo_trusted``), so this is where a host's escape sequences are neutralised."""

    def say(text: str, fg: str | None = None) -> None:
        line = safe_text(text)
        echo(click.style(line, fg=fg) if (color and fg) else line)

    return say


def render_reports(reports: Mapping[str, HostReport], role: str, check: bool, show_diff: bool,
                   echo: Callable[[str], None], color: bool) -> None:
    say = _sayer(echo, color)
    mode = " (check mode: nothing changed)" if check else ""
    say(f"ROLE [{role}]{mode}")
    for name, report in reports.items():
        say("")
        head = "SKIPPED" if report.status == "skipped" else {True: "ok", False: "FAILED"}[report.ok]
        run = f", run {report.run_id}" if report.run_id else ""
        say(f"{name}: {head} ({report.status}{run})", "green" if report.ok else "red")
        for line in report.recovered:
            say(f"  recovered first: {line}", "magenta")
        if check:
            verb = "would change"
        elif report.ok:
            verb = "changed"
        elif report.status == STATUS_UNKNOWN:
            verb = "planned (outcome unknown)"
        else:
            verb = "planned, not applied"
        for change in report.changes:
            say(f"  {verb} {change['path']} ({change['action']}, {change['kind']})", "yellow")
            if show_diff and change.get("diff"):
                for line in change["diff"].rstrip("\n").splitlines():
                    tint = "green" if line.startswith("+") else "red" if line.startswith("-") else None
                    say("    " + line, tint)
        for handler in report.handlers:
            if check:
                say(f"  would run handler: {handler}")
            elif report.ok and report.status == STATUS_FINISHED:
                pid = f" (pid {report.pid})" if report.pid else ""
                say(f"  ran handler: {handler}{pid}, server healthy")
        for warning in report.warnings:
            say(f"  warning: {warning}", "magenta")
        for note in report.notes:
            say(f"  note: {note}")
        if report.error:
            say(f"  error: {report.error}", "red")
        if report.log_tail:
            say("  server log (last start):")
            for line in report.log_tail.splitlines():
                say("    | " + line)
        if report.restored and not report.ok:
            say(f"  restored: {', '.join(report.restored)}")
    render_recap(reports, echo, color)


def render_recap(reports: Mapping[str, HostReport], echo: Callable[[str], None], color: bool) -> None:
    say = _sayer(echo, color)
    say("")
    say("RECAP")
    width = max((len(n) for n in reports), default=4)
    for name, report in reports.items():
        skipped = 1 if report.status == "skipped" else 0  # not attempted: a rollout stopped first
        failed = 0 if report.ok or skipped else 1
        if report.status == STATUS_UNKNOWN:
            line = (f"{name.ljust(width)} : ok={report.tasks_ok} unknown: the host will finish or roll back by "
                    f"itself; run `gpuops history` failed={failed} skipped={skipped}")
        else:
            line = f"{name.ljust(width)} : ok={report.tasks_ok} changed={report.changed} failed={failed} skipped={skipped}"
        say(line, "green" if report.ok else "red")


def render_history(runs_by_host: Mapping[str, Any], echo: Callable[[str], None]) -> None:
    say = _sayer(echo, False)
    for name, value in runs_by_host.items():
        say(f"{name}:")
        if isinstance(value, str):
            say(f"  error: {value}")
            continue
        runs = value.get("runs", []) if isinstance(value, dict) else value
        for note in (value.get("notes", []) if isinstance(value, dict) else []):
            say(f"  note: {note}")
        if not runs:
            say("  (no runs)")
        for run in runs:
            what = run.get("role") or "?"
            if run.get("kind") == KIND_ROLLBACK:
                what = f"rollback of {run.get('target')}" + (" (recomposed)" if run.get("recompose") else "")
            outcome = run["outcome"] + (f", undone by {run['undone_by']}" if run.get("undone_by") else "")
            error = f"  ({str(run['error']).splitlines()[0]})" if run.get("error") else ""
            say(f"  {run['run_id']}  {run.get('time') or '':20}  {what:16} changed={run['changed']}  "
                 f"{outcome}  by {run.get('user') or '?'}{error}")
