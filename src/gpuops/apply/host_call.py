"""One bundled host module run once over an open connection, its answer the last line it prints
(a JSON object): the replica drain helper and the deployment's node check both speak this way.
What the host prints is untrusted: anything but a JSON object is one clear error."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError
from gpuops.shipping import python_command, python_stdin

if TYPE_CHECKING:
    from gpuops.transport import Connection


def module_answer(conn: "Connection", variables: Mapping[str, Any], module: str, payload: dict[str, Any],
                  timeout: float, what: str) -> dict[str, Any]:
    """``module`` (a host-side module of ``gpuops.remote``) run with ``payload`` under the host's
    ``gpuops_python``; its answer. ``what`` names it in the error (``"n1: the drain helper"``)."""

    python = variables.get("gpuops_python")
    done = conn.run(python_command(str(python) if python else None), python_stdin(module, payload), timeout=timeout)
    lines = done.stdout_text().strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr_text().strip().splitlines() or [f"exit status {done.exit_status}"])[-1]
        raise GpuopsError(f"{what} printed nothing readable ({tail})") from None
    if not isinstance(answer, dict):
        raise GpuopsError(f"{what} answered {answer!r}")
    return answer
