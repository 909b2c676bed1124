"""Run a bench on hosts (the I/O edge): one exec per host, hosts in parallel, results saved home.

The client runs next to the server (``gpuops/remote/bench_client.py`` shipped on stdin); its framed
output comes back when it ends. Ctrl-C here asks every host's client to stop (SIGINT through its
pid file, on a second short exec); each client then reports what it measured and exits, so the
partial results are still parsed and saved.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from gpuops.bench.frames import parse_frames
from gpuops.bench.options import BenchOptions, build_payload, host_port, progress_command, server_url, stop_command
from gpuops.bench.record import JSONObject, ResultDocument
from gpuops.bench.repeats import merge_repeats
from gpuops.bench.results import RunContext, build_result
from gpuops.bench.store import ResultsStore
from gpuops.bench.suites import suite as suite_spec
from gpuops.errors import GpuopsError
from gpuops.shipping import python_command, python_stdin, source
from gpuops.transport import prepare_ssh
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport import ConnectOptions

STOP_GRACE_S = 60.0
PROGRESS_INTERVAL_S = 3.0  # how often a progress display reads the hosts' progress files


@dataclass
class HostBench:
    """What one host's bench produced: a saved result, or why there is none."""

    host: str
    result: ResultDocument | None = None
    file: Path | None = None
    error: str | None = None
    status: str = "waiting"  # waiting | running | done | failed | stopping
    repeat: int = 0  # which repeat is running (1-based) with --repeat
    progress: JSONObject | None = None  # the client's last progress file: done, total, stage, started (host clock)
    started_at: float | None = None  # when this host's run began (here)


@frozen
class BenchTarget:
    """A host and how its client is reached: the URL the client uses, the python that runs it."""

    host: Host
    url: str
    python: str | None  # None: the host's python3


def targets_for(hosts: Sequence[Host], port: int | None, url: str | None, remote: bool) -> list[BenchTarget]:
    if not remote:
        return [BenchTarget(h, url or server_url(host_port(h.vars, port)), sys.executable) for h in hosts]
    return [BenchTarget(h, server_url(host_port(h.vars, port)),
                        str(h.vars["gpuops_python"]) if h.vars.get("gpuops_python") else None) for h in hosts]


def run_bench(
    targets: Sequence[BenchTarget],
    options: BenchOptions,
    store: ResultsStore,
    connect_options: ConnectOptions,
    remote: bool = True,
    on_change: Callable[[dict[str, HostBench]], None] | None = None,
    timeout: float | None = None,
) -> dict[str, HostBench]:
    """Each target's bench; with ``timeout`` (``--timeout``), a host still running that many seconds
    after it began is failed, its client asked to stop, and the command does not wait for it."""

    run_id = uuid.uuid4().hex[:12]
    started = time.time()
    worker = suite_spec(options.suite).torchrun_worker
    worker_source = source(worker) if worker else None
    states = {t.host.name: HostBench(t.host.name) for t in targets}
    finished = {t.host.name: threading.Event() for t in targets}
    deadlines: dict[str, float] = {}  # per host, from when its run began (--timeout)
    given_up: set[str] = set()  # hosts past their deadline: what their thread finds later is dropped
    settled: set[str] = set()  # hosts whose results are home: never given up from then on
    lock = threading.Lock()

    def changed() -> None:
        if on_change is not None:
            with lock:
                on_change(dict(states))

    def one(target: BenchTarget) -> None:
        name = target.host.name
        state = HostBench(name)  # this thread's copy; it becomes the host's state unless given up
        from gpuops.transport import connect

        def left() -> float | None:
            if timeout is None:
                return None
            remaining = deadlines[name] - time.monotonic()
            if remaining <= 0:
                raise GpuopsError(f"{name}: {_timed_out(timeout)}")
            return remaining

        def publish() -> None:
            with lock:
                if name not in given_up:
                    states[name] = state

        try:
            if timeout is not None:
                deadlines[name] = time.monotonic() + timeout
            payload = build_payload(options, run_id, target.url, target.host.vars, worker_source,
                                    host_name=target.host.name)
            state.status = "running"
            state.started_at = time.time()
            publish()
            changed()
            repeats: list[ResultDocument] = []
            traces: list[JSONObject] = []  # raw traces a profile brought home (--fetch-traces)
            conn = connect(target.host, connect_options)
            try:
                for index in range(options.repeat):
                    if state.status == "stopping" and repeats:
                        break  # Ctrl-C: keep the repeats already home
                    state.repeat = index + 1
                    changed()
                    done = conn.run(python_command(target.python), python_stdin("bench_client", payload),
                                    timeout=left())
                    run = parse_frames(done.stdout_text(), run_id)
                    if run.start is None:
                        tail = (done.stderr_text().strip().splitlines() or [f"exit status {done.exit_status}"])[-1]
                        if repeats:
                            break
                        raise GpuopsError(f"{target.host.name}: the bench client did not start: {tail}")
                    repeats.append(build_result(RunContext(target.host.name, options, target.url, started, remote), run))
                    traces.extend(run.trace_files)
                    if run.partial:
                        break
            finally:
                conn.close()
            result = merge_repeats(repeats) if options.repeat > 1 else repeats[0]
            summary = result.get("summary") or {}
            measured = (result.get("samples") or result.get("levels") or result.get("allreduce") or result.get("fusion")
                        or summary.get("stages"))
            with lock:  # one decision, taken with the wait loop's: kept (and saved), or given up (and dropped)
                keep = name not in given_up
                if keep:
                    settled.add(name)
            if (measured or summary.get("completed")) and keep:
                if traces:
                    result["trace_files"] = store.save_traces(str(result["id"]), traces)
                state.file = store.save(result)
            state.result = result
            state.error = "; ".join(result.get("errors") or []) or None
            state.status = "done" if result.get("ok") else "failed"
        except GpuopsError as exc:
            message = str(exc)
            prefix = f"{target.host.name}: "
            state.error = message[len(prefix):] if message.startswith(prefix) else message
            state.status = "failed"
        except Exception as exc:  # a bug must fail its host only, named
            state.error = f"internal error: {type(exc).__name__}: {exc}"
            state.status = "failed"
        finally:
            publish()  # the same object once running; a host that failed before that needs it here
            if name not in given_up:
                finished[name].set()
        changed()

    if remote:
        prepare_ssh([t.host for t in targets])
    threads = [threading.Thread(target=one, args=(t,), name=f"bench-{t.host.name}", daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    if on_change is not None:
        poller = threading.Thread(target=_poll_progress, args=(targets, states, finished, run_id, connect_options,
                                                               changed), name="bench-progress", daemon=True)
        poller.start()
    # Wait by polling events, never Thread.join: a Ctrl-C landing inside join() can leave a still
    # running thread marked as stopped (a CPython quirk), and its results would be lost.
    try:
        _wait_all(finished.values(), None, lambda: _give_up_overdue(targets, states, finished, deadlines, given_up,
                                                                     settled, lock, timeout, run_id, connect_options,
                                                                     changed))
    except KeyboardInterrupt:
        for state in states.values():
            if state.status == "running":
                state.status = "stopping"
        changed()
        _stop_clients([t for t in targets if states[t.host.name].status == "stopping"], run_id, connect_options)
        try:
            _wait_all(finished.values(), STOP_GRACE_S)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting, report what is home
        for name, state in states.items():
            if not finished[name].is_set():
                state.status = "failed"
                state.error = state.error or "interrupted before the host sent its results"
            elif state.status == "stopping":  # it finished while being marked
                state.status = "done" if state.result and state.result.get("ok") else "failed"
    return states


def _poll_progress(targets: Sequence[BenchTarget], states: dict[str, HostBench], finished: dict[str, threading.Event],
                   run_id: str, connect_options: ConnectOptions, changed: Callable[[], None]) -> None:
    """Read each running host's progress file every few seconds (one short exec) for the display."""
    import json

    from gpuops.transport import connect

    while not all(e.is_set() for e in finished.values()):
        for target in targets:
            name = target.host.name
            if finished[name].is_set() or states[name].status != "running":
                continue
            try:
                conn = connect(target.host, connect_options)
                try:
                    text = conn.run(progress_command(run_id, name), timeout=10).stdout_text().strip()
                finally:
                    conn.close()
                if text:
                    data = json.loads(text)
                    if isinstance(data, dict):
                        states[name].progress = data
            except Exception:
                continue  # progress is a courtesy: the run itself reports any failure
        changed()
        for _ in range(int(PROGRESS_INTERVAL_S * 10)):
            if all(e.is_set() for e in finished.values()):
                return
            time.sleep(0.1)


def eta_s(state: HostBench, repeat: int = 1) -> float | None:
    """Seconds left for one host, from its progress so far (None until something is done)."""
    progress = state.progress or {}
    done, total = progress.get("done"), progress.get("total")
    if not state.started_at or not isinstance(done, int) or not isinstance(total, int) or done <= 0 or total <= 0:
        return None
    elapsed = time.time() - state.started_at
    repeats_left = max(0, repeat - max(state.repeat, 1))
    per_record = elapsed / (done + total * (max(state.repeat, 1) - 1))
    return per_record * (total - done + total * repeats_left)


def _wait_all(events: Iterable[threading.Event], timeout: float | None,
              each: Callable[[], None] | None = None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(events)
    while pending and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.1)
        if each is not None:
            each()
        pending = [e for e in pending if not e.is_set()]


def _timed_out(timeout: float) -> str:
    return f"timed out: still running after {timeout:.0f} s (--timeout); its bench client was asked to stop"


def _give_up_overdue(targets: Sequence[BenchTarget], states: dict[str, HostBench], finished: dict[str, threading.Event],
                     deadlines: dict[str, float], given_up: set[str], settled: set[str], lock: threading.Lock,
                     timeout: float | None, run_id: str, connect_options: ConnectOptions,
                     changed: Callable[[], None]) -> None:
    """Fail every host past its deadline now, whatever its transport does with the command's time
    limit (an SSH channel's timeout is one of silence, and a client that prints progress is never
    silent); its client is asked to stop, in the background: the host may not answer at all. A host
    whose results are already home (``settled``: being saved) is not given up: it is done."""
    if timeout is None:
        return
    now = time.monotonic()
    overdue = []
    with lock:
        for target in targets:
            name = target.host.name
            if (name in deadlines and name not in given_up and name not in settled and not finished[name].is_set()
                    and now > deadlines[name]):
                given_up.add(name)
                states[name] = HostBench(name, error=_timed_out(timeout), status="failed",
                                         started_at=states[name].started_at)
                overdue.append(target)
    if not overdue:
        return
    threading.Thread(target=_stop_clients, args=(overdue, run_id, connect_options), name="bench-stop",
                     daemon=True).start()
    for target in overdue:
        finished[target.host.name].set()
    changed()


def _stop_clients(targets: Sequence[BenchTarget], run_id: str, connect_options: ConnectOptions) -> None:
    from gpuops.transport import connect

    def stop(target: BenchTarget) -> None:
        try:
            conn = connect(target.host, connect_options)
            try:
                conn.run(stop_command(run_id, target.host.name), timeout=20)
            finally:
                conn.close()
        except Exception:
            pass  # the host is gone; its run thread reports the failure

    stoppers = [threading.Thread(target=stop, args=(t,), daemon=True) for t in targets]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join(25)
