"""gpuops rollback and gpuops history: undo a run from its backups on the host; list the journal."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

from gpuops.apply.options import ApplyOptions, HostReport, current_user, new_run_id
from gpuops.apply.remote_exec import gather_as, run_helper
from gpuops.errors import GpuopsError

if TYPE_CHECKING:
    from gpuops.inventory import Host


def rollback_hosts(hosts: Sequence["Host"], target: str | None, options: ApplyOptions) -> dict[str, HostReport]:
    from gpuops.apply.journal import append_home
    from gpuops.remote import source
    from gpuops.transport import connect, run_on_hosts

    run_id = new_run_id()

    def one(host: "Host") -> HostReport:
        variables = dict(host.vars or {})
        state_dir = str(variables.get("gpuops_state_dir") or "/var/lib/gpuops")
        payload = {
            "mode": "rollback", "run_id": run_id, "state_dir": state_dir, "target": target,
            "meta": {"role": "rollback", "user": current_user()},
            "process_manager": source("process_manager"),
        }
        conn = connect(host, options.connect)
        try:
            result = run_helper(conn, variables, payload, options)
        finally:
            conn.close()
        ok = bool(result.get("ok"))
        report = HostReport(host=host.name, ok=ok, status=result.get("status", "failed"), run_id=run_id,
                            restored=list(result.get("restored", [])), changed=len(result.get("restored", [])),
                            error=None if ok else result.get("error"))
        if ok:
            report.notes.append(f"undid run {result.get('target')}: {result.get('service', '')}")
        append_home({"run_id": run_id, "host": host.name, "role": "rollback", "target": result.get("target"),
                     "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "outcome": report.status,
                     "changes": [{"path": p} for p in report.restored], "error": report.error})
        return report

    outcomes = run_on_hosts(hosts, one, forks=options.forks, rollout=options.rollout, failed=lambda r: not r.ok)
    return {name: (o.value if o.ok and o.value is not None
                   else HostReport(host=name, ok=False, status="skipped" if o.skipped else "failed", error=o.error))
            for name, o in outcomes.items()}


def history_hosts(hosts: Sequence["Host"], options: ApplyOptions) -> dict[str, Any]:
    """Each host's journal, folded into runs (one gather exec per host)."""
    from gpuops.apply.journal import fold_runs
    from gpuops.apply.probes import journal_probe
    from gpuops.gather import ProbeFailure
    from gpuops.transport import connect, run_on_hosts

    def one(host: "Host") -> list[dict[str, Any]]:
        state_dir = str((host.vars or {}).get("gpuops_state_dir") or "/var/lib/gpuops")
        conn = connect(host, options.connect)
        try:
            values = gather_as(conn, [journal_probe(state_dir)], "", options)
        finally:
            conn.close()
        records = values["apply.journal"]
        if isinstance(records, ProbeFailure):
            raise GpuopsError(f"{host.name}: cannot read the journal: {records.reason}")
        return fold_runs(records)

    return run_on_hosts(hosts, one, forks=options.forks)
