"""Values shared by apply, rollback and history: their options, run ids, the user. (The per-host
report they return is ``apply/host_report.py``.)"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from gpuops.facts.managed import DEFAULT_STATE_DIR
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport import ConnectOptions
    from gpuops.transport.rollout import Rollout


@frozen
class ApplyOptions:
    """How apply, rollback and history run, from the command's flags: how hosts are reached, --check and --diff,
    forks, the per-host timeout, the rollout in batches and rollback's --force."""

    connect: "ConnectOptions"
    check: bool = False
    diff: bool = False
    forks: int = 16
    timeout: float | None = None       # seconds per host, for everything on it (--timeout)
    force: bool = False                # rollback: overwrite files changed since the run (kept aside)
    flush_cache: bool = False          # --flush-cache: offer no kept facts or scans, recall no no-op plan

    def deadline(self) -> float | None:
        """The monotonic time by which a host must be done (None: no limit)."""
        import time

        return None if self.timeout is None else time.monotonic() + self.timeout
    rollout: "Rollout | None" = None  # --serial / --max-fail-percentage: hosts in batches


def current_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def inventory_state_dir(host: "Host") -> str:
    """Where the host keeps gpuops' state (journal, desired state, backups) as the inventory says."""
    return str((host.vars or {}).get("gpuops_state_dir") or DEFAULT_STATE_DIR)
