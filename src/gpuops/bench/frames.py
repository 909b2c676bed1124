"""Read the framed output of the remote bench client (pure).

Every record is one line ``GPUOPS-BENCH <run_id> <kind> <json>``; anything else on stdout (a tool's
chatter, a torch warning) is ignored, and a line cut short by an interrupt is dropped, so a partial
run still yields every record that made it home whole.

Everything the host sent passes the secrets policy here, before anything prints or stores it
(``secret_policy.mask_reported``): the server's ``api_key`` and ``launch_command``, argv lists, URLs,
and each secret found in one record wherever it appears in another.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpuops.bench.record import JSONObject
from gpuops.secret_policy import mask_reported, reported_secrets

FRAME = "GPUOPS-BENCH"


@dataclass
class RemoteRun:
    """The records of one host's bench run, grouped by kind, in arrival order: each a JSON object as
    the host sent it (secrets masked), narrowed where it is read."""

    run_id: str
    start: JSONObject | None = None
    host: JSONObject | None = None
    server: JSONObject | None = None          # the server's answers before the run (server_info, model_info, ...)
    server_after: JSONObject | None = None
    samples: list[JSONObject] = field(default_factory=list)
    levels: list[JSONObject] = field(default_factory=list)
    allreduce: list[JSONObject] = field(default_factory=list)
    fusion: list[JSONObject] = field(default_factory=list)
    profile: list[JSONObject] = field(default_factory=list)      # one per rank's trace (profile suite)
    trace_files: list[JSONObject] = field(default_factory=list)  # raw traces, base64 (--fetch-traces)
    progress: JSONObject | None = None
    tool: list[JSONObject] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[JSONObject] = field(default_factory=list)
    end: JSONObject | None = None

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def partial(self) -> bool:
        return self.end is None or bool(self.end.get("partial"))


def parse_frames(stdout: str, run_id: str) -> RemoteRun:
    run = RemoteRun(run_id=run_id)
    prefix = f"{FRAME} {run_id} "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        kind, _, text = line[len(prefix):].partition(" ")
        try:
            record = json.loads(text)
        except ValueError:
            continue  # a line cut by an interrupt
        if not isinstance(record, dict):
            continue
        if kind in ("start", "host", "server", "server_after", "end"):
            setattr(run, kind, record)
        elif kind == "sample":
            run.samples.append(record)
        elif kind == "level":
            run.levels.append(record)
        elif kind == "allreduce":
            run.allreduce.append(record)
        elif kind == "fusion":
            run.fusion.append(record)
        elif kind == "profile":
            run.profile.append(record)
        elif kind == "trace_file":
            run.trace_files.append(record)
        elif kind == "progress":
            run.progress = record
        elif kind == "tool":
            run.tool.append(record)
        elif kind == "note":
            run.notes.append(str(record.get("message", "")))
        elif kind == "error":
            run.errors.append(record)
    return masked_run(run)


_REPORTED = ("start", "host", "server", "server_after", "samples", "levels", "allreduce", "fusion", "profile", "progress",
             "tool", "notes", "errors", "end")


def masked_run(run: RemoteRun) -> RemoteRun:
    """``run`` with every secret its records carry masked (one pass finds them all first)."""

    secrets = reported_secrets(*(getattr(run, name) for name in _REPORTED if getattr(run, name)))
    for name in _REPORTED:
        value = getattr(run, name)
        if value:
            setattr(run, name, mask_reported(value, secrets))
    return run
