"""Human output for apply/rollback/history: per-host changes, diffs, warnings, an Ansible-like recap."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import click

from gpuops.apply.host_report import HostReport


def _style(text: str, color: str, enabled: bool) -> str:
    return click.style(text, fg=color) if enabled else text


def render_reports(reports: Mapping[str, HostReport], role: str, check: bool, show_diff: bool,
                   echo: Callable[[str], None], color: bool) -> None:
    mode = " (check mode: nothing changed)" if check else ""
    echo(f"ROLE [{role}]{mode}")
    for name, report in reports.items():
        echo("")
        head = "SKIPPED" if report.status == "skipped" else {True: "ok", False: "FAILED"}[report.ok]
        run = f", run {report.run_id}" if report.run_id else ""
        echo(_style(f"{name}: {head} ({report.status}{run})", "green" if report.ok else "red", color))
        for line in report.recovered:
            echo(_style(f"  recovered first: {line}", "magenta", color))
        if check:
            verb = "would change"
        elif report.ok:
            verb = "changed"
        elif report.status == "unknown":
            verb = "planned (outcome unknown)"
        else:
            verb = "planned, not applied"
        for change in report.changes:
            echo(_style(f"  {verb} {change['path']} ({change['action']}, {change['kind']})", "yellow", color))
            if show_diff and change.get("diff"):
                for line in change["diff"].rstrip("\n").splitlines():
                    tint = "green" if line.startswith("+") else "red" if line.startswith("-") else None
                    echo("    " + (click.style(line, fg=tint) if (color and tint) else line))
        for handler in report.handlers:
            if check:
                echo(f"  would run handler: {handler}")
            elif report.ok and report.status == "finished":
                pid = f" (pid {report.pid})" if report.pid else ""
                echo(f"  ran handler: {handler}{pid}, server healthy")
        for warning in report.warnings:
            echo(_style(f"  warning: {warning}", "magenta", color))
        for note in report.notes:
            echo(f"  note: {note}")
        if report.error:
            echo(_style(f"  error: {report.error}", "red", color))
        if report.log_tail:
            echo("  server log (last start):")
            for line in report.log_tail.splitlines():
                echo("    | " + line)
        if report.restored and not report.ok:
            echo(f"  restored: {', '.join(report.restored)}")
    render_recap(reports, echo, color)


def render_recap(reports: Mapping[str, HostReport], echo: Callable[[str], None], color: bool) -> None:
    echo("")
    echo("RECAP")
    width = max((len(n) for n in reports), default=4)
    for name, report in reports.items():
        skipped = 1 if report.status == "skipped" else 0  # not attempted: a rollout stopped first
        failed = 0 if report.ok or skipped else 1
        if report.status == "unknown":
            line = (f"{name.ljust(width)} : ok={report.tasks_ok} unknown: the host will finish or roll back by "
                    f"itself; run `gpuops history` failed={failed} skipped={skipped}")
        else:
            line = f"{name.ljust(width)} : ok={report.tasks_ok} changed={report.changed} failed={failed} skipped={skipped}"
        echo(_style(line, "green" if report.ok else "red", color))


def render_history(runs_by_host: Mapping[str, Any], echo: Callable[[str], None]) -> None:
    for name, value in runs_by_host.items():
        echo(f"{name}:")
        if isinstance(value, str):
            echo(f"  error: {value}")
            continue
        runs = value.get("runs", []) if isinstance(value, dict) else value
        for note in (value.get("notes", []) if isinstance(value, dict) else []):
            echo(f"  note: {note}")
        if not runs:
            echo("  (no runs)")
        for run in runs:
            what = run.get("role") or "?"
            if run.get("kind") == "rollback":
                what = f"rollback of {run.get('target')}" + (" (recomposed)" if run.get("recompose") else "")
            outcome = run["outcome"] + (f", undone by {run['undone_by']}" if run.get("undone_by") else "")
            error = f"  ({str(run['error']).splitlines()[0]})" if run.get("error") else ""
            echo(f"  {run['run_id']}  {run.get('time') or '':20}  {what:16} changed={run['changed']}  "
                 f"{outcome}  by {run.get('user') or '?'}{error}")
