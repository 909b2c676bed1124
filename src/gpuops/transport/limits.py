"""How much a host may send: every read of host output is bounded while it is read.

A host is untrusted: a runaway probe (a replaced ``nvidia-smi`` printing 300 MB) or a hostile one
must not take the operator's machine to gigabytes of memory. So each exec's stdout and each of its
stderr may carry at most ``EXEC_OUTPUT_LIMIT`` bytes: past it the command is stopped and the host
fails with "output over 64 MiB". Inside one gather each probe has its own, smaller limit
(``gather.PROBE_OUTPUT_LIMIT``, more where a probe declares it): the host cuts the probe's output
there and that one fact fails while the others parse. A line of apply's transaction channel and a
reply read over HTTP from a host are bounded the same way.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence
from typing import IO

MiB = 1024 * 1024
EXEC_OUTPUT_LIMIT = 64 * MiB  # stdout, and stderr, of one command on a host
STREAM_LINE_LIMIT = 4 * MiB  # one line of a stream (apply's transaction channel)
STREAM_STDERR_LIMIT = 1 * MiB  # what a stream keeps of its command's stderr (its tail explains a failure)
HTTP_REPLY_LIMIT = 8 * MiB  # one HTTP answer read from a host (a router's)
_CHUNK = 65536


def over_message(limit: int) -> str:
    return f"output over {limit // MiB} MiB"


class OutputOverLimit(Exception):
    """A command sent more than ``limit`` bytes on one of its streams (it has been stopped)."""

    def __init__(self, limit: int) -> None:
        super().__init__(over_message(limit))
        self.limit = limit


class BoundedBuffer:
    """Chunks of one stream, refusing to hold more than ``limit`` bytes."""

    def __init__(self, limit: int = EXEC_OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.size = 0
        self.over = False
        self._chunks: list[bytes] = []

    def add(self, chunk: bytes) -> bool:
        """Keep ``chunk``; False (and nothing kept) once the stream is over its limit."""
        self.size += len(chunk)
        if self.size > self.limit:
            self.over = True
            self._chunks.clear()
            return False
        self._chunks.append(chunk)
        return True

    def value(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks = [data]
        return data


def run_bounded(argv: Sequence[str], stdin: bytes, timeout: float | None,
                limit: int = EXEC_OUTPUT_LIMIT) -> tuple[bytes, bytes, int]:
    """``subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)`` that stops the
    process (and raises ``OutputOverLimit``) as soon as its stdout or stderr passes ``limit``.

    Raises ``subprocess.TimeoutExpired`` as ``run`` does (the process killed) and OSError when it
    cannot start."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = BoundedBuffer(limit), BoundedBuffer(limit)

    def drain(stream: IO[bytes], into: BoundedBuffer) -> None:
        try:
            while True:
                chunk = stream.read1(_CHUNK)  # type: ignore[attr-defined]
                if not chunk:
                    return
                if not into.add(chunk):
                    proc.kill()
                    return
        except (OSError, ValueError):
            return

    def feed() -> None:
        assert proc.stdin is not None
        try:
            if stdin:
                proc.stdin.write(stdin)
            proc.stdin.close()
        except OSError:
            pass  # the command closed its stdin early; its exit status says why

    assert proc.stdout is not None and proc.stderr is not None
    threads = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        status = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for thread in threads:
            thread.join(5)  # a child that kept the pipes open must not hold the command forever
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    if out.over or err.over:
        raise OutputOverLimit(limit)
    return out.value(), err.value(), status
