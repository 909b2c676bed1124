"""`bench --timeout` when the transport never enforces it: the runner's own wait loop must fail the
host, ask its client to stop and return. An SSH channel's timeout is one of silence, and a bench
client that prints progress is never silent, so this loop is the only thing that keeps the promise;
the integration test (tests/integration/test_bench_timeout.py) stalls a server, where the channel's
silence timeout races the loop, and so cannot tell whether the loop works on its own."""

from __future__ import annotations

import threading
from pathlib import Path

from gpuops.bench.options import BenchOptions
from gpuops.bench.runner import run_bench, targets_for
from gpuops.bench.store import ResultsStore
from gpuops.inventory import local_inventory
from gpuops.transport import ConnectOptions
from gpuops.transport.base import ExecResult


class NeverSilentConnection:
    """A host whose bench client keeps talking: its run ignores ``timeout`` (as a channel that is
    never silent does) and returns only once the test lets it go; the stop command is answered."""

    def __init__(self, host, release: threading.Event, stopped: threading.Event) -> None:
        self.host = host
        self._release = release
        self._stopped = stopped

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        if "kill -INT" in command:  # the stop command (sent from a background thread)
            self._stopped.set()
            return ExecResult(b"", b"", 0)
        self._release.wait(300)  # the bench client: it outlives any deadline the transport is given
        return ExecResult(b"", b"", 0)

    def close(self) -> None:
        pass


def test_timeout_fails_a_host_whose_transport_never_times_out(tmp_path: Path) -> None:
    release = threading.Event()
    stopped = threading.Event()
    options = ConnectOptions(connector=lambda host: NeverSilentConnection(host, release, stopped))
    targets = targets_for(local_inventory().select(None), None, "http://127.0.0.1:9", remote=False)
    returned: dict = {}

    def bench() -> None:
        returned.update(run_bench(targets, BenchOptions(suite="decode", output_len=4), ResultsStore(tmp_path),
                                  options, remote=False, timeout=0.5))

    runner = threading.Thread(target=bench, daemon=True)
    runner.start()
    runner.join(60)  # a bound on a hang, not a measured time: the loop gives up after 0.5 s
    try:
        assert not runner.is_alive(), "run_bench kept waiting for a host past --timeout"
        state = returned["localhost"]
        assert state.status == "failed" and "timed out" in (state.error or ""), state
        assert state.file is None
        assert stopped.wait(60), "its bench client was never asked to stop"
    finally:
        release.set()


class AnsweringConnection:
    """A host whose bench client answers at once (the parsing of its answer is stubbed below)."""

    def __init__(self, host) -> None:
        self.host = host

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        return ExecResult(b"", b"", 0)

    def close(self) -> None:
        pass


def test_a_result_being_saved_as_the_deadline_passes_is_reported_as_saved(tmp_path: Path, monkeypatch) -> None:
    """The window between "not given up" and the save: a host whose result is already home when its
    deadline passes must end reported as done with that file, never as timed out with a result
    in the store that its report does not name (or the other way round)."""
    import types

    from gpuops.bench import runner

    monkeypatch.setattr(runner, "parse_frames", lambda text, run_id: types.SimpleNamespace(start="t0", partial=False, trace_files=[]))
    monkeypatch.setattr(runner, "build_result", lambda ctx, run: {
        "id": "r1", "host": "localhost", "suite": "decode", "created": "2026-11-30T00:00:00Z", "ok": True,
        "samples": [1.0], "levels": [], "allreduce": [], "summary": {"completed": 1}, "errors": []})
    saving, release = threading.Event(), threading.Event()

    class SlowStore(ResultsStore):
        def save(self, result):  # the disk is slow: the deadline passes while the result is written
            saving.set()
            release.wait(60)
            return super().save(result)

    store = SlowStore(tmp_path)
    options = ConnectOptions(connector=lambda host: AnsweringConnection(host))
    targets = targets_for(local_inventory().select(None), None, "http://127.0.0.1:9", remote=False)
    returned: dict = {}
    bench = threading.Thread(target=lambda: returned.update(run_bench(
        targets, BenchOptions(suite="decode", output_len=4), store, options, remote=False, timeout=0.3)), daemon=True)
    bench.start()
    try:
        assert saving.wait(60)
        deadline_passed = threading.Event()
        deadline_passed.wait(1.0)  # past the 0.3 s deadline: the wait loop (every 0.1 s) looks at the host meanwhile
    finally:
        release.set()
    bench.join(60)
    assert not bench.is_alive()
    state = returned["localhost"]
    saved = sorted(p for p in tmp_path.rglob("*.json") if "index" not in p.name)
    assert state.status == "done", state
    assert state.file is not None and Path(state.file) in saved
