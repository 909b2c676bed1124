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
