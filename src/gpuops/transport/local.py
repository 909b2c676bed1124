"""The machine you stand on: same contract as SSH, through /bin/sh, no SSH involved."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

from gpuops.errors import TransportError
from gpuops.transport.base import ExecResult

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport.stream import Stream


class LocalConnection:
    def __init__(self, host: Host) -> None:
        self.host = host

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", command],
                input=stdin,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TransportError(self.host.name, f"command timed out after {timeout:.0f} s") from exc
        except OSError as exc:
            raise TransportError(self.host.name, f"cannot run /bin/sh: {exc}") from exc
        return ExecResult(proc.stdout, proc.stderr, proc.returncode)

    def open_stream(self, command: str) -> Stream:
        from gpuops.transport.stream import ProcessStream

        return ProcessStream(["/bin/sh", "-c", command], self.host.name)

    def close(self) -> None:
        pass
