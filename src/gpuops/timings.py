"""`--timings` (and -vv): where a command's wall time went, phase by phase, on stderr.

    startup    interpreter start until gpuops' first module is imported (Python itself, site)
    imports    gpuops' own and click's imports and argument parsing, until the command body runs
    inventory  reading and selecting the inventory
    ssh-import importing fabric/paramiko (only for SSH hosts)
    connect    TCP connect and key exchange (paramiko; the openssh transport does it inside exec)
    auth       user authentication (paramiko)
    exec       each remote command, from start to exit status (the host's own work included)
    parse      turning the gathered output into facts and judging the gates
    plan       computing a role's changes (apply)
    render     printing the result (tables or JSON)
    other      the rest of the wall time (threads, closing, exiting)

Host phases are per host; with several hosts in parallel they overlap, so the report shows each
host's phases and the wall time once. ``$GPUOPS_TIMINGS_JSON=FILE`` also writes the figures as
JSON (what ``benchmarks/phase_profile`` reads).

The recorder is process-wide, as logging is: commands run once per process, and phases happen in
the transport's threads as well as the main one. When it is off, ``span`` costs one attribute read.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from gpuops import FIRST_IMPORT_AT as first

PHASES = ("startup", "imports", "inventory", "ssh-import", "connect", "auth", "exec", "parse", "plan", "render")
JSON_ENV = "GPUOPS_TIMINGS_JSON"


@dataclass
class _Recorder:
    """The process-wide recording: whether it is on, when the command's body started, and the spans (phase,
    host, start, end) so far; ``lock`` guards them against the transport's threads."""

    enabled: bool = False
    command_started: float | None = None
    spans: list[tuple[str, str | None, float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_RECORDER = _Recorder()


def process_started() -> float | None:
    """This process' start on the ``time.monotonic`` clock (Linux: /proc; 10 ms resolution), else None."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat(5), after pid and comm
        started_boot = ticks / os.sysconf("SC_CLK_TCK")
        now_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.monotonic() - (now_boot - started_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def enable() -> None:
    """Start recording (called when the command's options are parsed: that is where imports end)."""
    if not _RECORDER.enabled:
        _RECORDER.enabled = True
        _RECORDER.command_started = time.monotonic()


def enabled() -> bool:
    return _RECORDER.enabled


def record(phase: str, started: float, ended: float, host: str | None = None) -> None:
    if _RECORDER.enabled:
        with _RECORDER.lock:
            _RECORDER.spans.append((phase, host, started, ended))


@contextmanager
def span(phase: str, host: str | None = None) -> Iterator[None]:
    """Time the body as ``phase`` (of ``host``); the time counts even when the body raises."""
    if not _RECORDER.enabled:
        yield
        return
    started = time.monotonic()
    try:
        yield
    finally:
        record(phase, started, time.monotonic(), host)


def summary(now: float | None = None) -> dict[str, object]:
    """The figures so far: wall time, the global phases and each host's phases, in seconds."""
    now = time.monotonic() if now is None else now
    began = process_started()
    command = _RECORDER.command_started
    phases: dict[str, float] = {}
    if began is not None:
        phases["startup"] = max(0.0, first - began)
    if command is not None:
        phases["imports"] = command - first
    hosts: dict[str, dict[str, float]] = {}
    with _RECORDER.lock:
        spans = list(_RECORDER.spans)
    for phase, host, start, end in spans:
        bucket = hosts.setdefault(host, {}) if host is not None else phases
        bucket[phase] = bucket.get(phase, 0.0) + (end - start)
    origin = began if began is not None else first
    wall = now - origin
    # Host phases run in parallel threads: the wall time spent in them is the longest host's.
    longest_host = max((sum(v.values()) for v in hosts.values()), default=0.0)
    phases["other"] = max(0.0, wall - sum(phases.values()) - longest_host)
    return {"wall": wall, "phases": phases, "hosts": hosts}


def report() -> str:
    data = summary()
    lines = [f"timings: {data['wall']:.3f} s wall"]
    global_phases: dict[str, float] = data["phases"]  # type: ignore[assignment]
    host_phases: dict[str, dict[str, float]] = data["hosts"]  # type: ignore[assignment]

    def ordered(values: dict[str, float]) -> list[str]:
        return [p for p in (*PHASES, "other") if p in values] + sorted(set(values) - set(PHASES) - {"other"})

    for phase in ordered(global_phases):
        if phase != "other":
            lines.append(f"  {phase:<11}{global_phases[phase]:8.3f} s")
    for host in sorted(host_phases):
        for phase in ordered(host_phases[host]):
            lines.append(f"  {phase:<11}{host_phases[host][phase]:8.3f} s  {host}")
    lines.append(f"  {'other':<11}{global_phases.get('other', 0.0):8.3f} s")
    return "\n".join(lines)


def finish() -> None:
    """At the end of a command: print the report on stderr (and write the JSON when asked)."""
    if not _RECORDER.enabled:
        return
    print(report(), file=sys.stderr, flush=True)
    target = os.environ.get(JSON_ENV)
    if target:
        with open(target, "w", encoding="utf-8") as fh:
            json.dump(summary(), fh, indent=1, sort_keys=True)
