"""The machine you stand on: same contract as SSH, through /bin/sh, no SSH involved."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

from gpuops.errors import TransportError
from gpuops.transport.base import ExecResult
from gpuops.transport.limits import OutputOverLimit, run_bounded
from gpuops.transport.stream import ProcessStream

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport.stream import Stream


class LocalConnection:
    def __init__(self, host: Host) -> None:
        self.host = host

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        try:
            stdout, stderr, returncode = run_bounded(["/bin/sh", "-c", command], stdin, timeout)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(self.host.name, f"command timed out after {timeout:.0f} s") from exc
        except OutputOverLimit as exc:
            raise TransportError(self.host.name, f"{exc} from one command: stopped") from exc
        except OSError as exc:
            raise TransportError(self.host.name, f"cannot run /bin/sh: {exc}") from exc
        return ExecResult(stdout, stderr, returncode)

    def open_stream(self, command: str) -> Stream:
        return ProcessStream(["/bin/sh", "-c", command], self.host.name)

    def close(self) -> None:
        pass
