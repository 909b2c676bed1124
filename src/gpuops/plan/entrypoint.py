"""The entrypoint a launch uses: the one the installed SGLang release recommends, read on the host.

``remote/sglang_entrypoint.py`` reads the release the launch python holds (its launch_server's
``__main__`` warning, its CLI's ``serve`` subcommand, the ``sglang`` script its installer wrote) and
answers ``serve`` with the script's path, or ``launch_server`` with why; ``apply/probes.py`` gathers
that for every python a launch may use. The ``entrypoint`` task module turns it into the words after
the python in the launch script and the systemd unit: ``SCRIPT serve`` or ``-m sglang.launch_server``.
A python the gather did not read (a release environment built by this very run) launches with
``-m sglang.launch_server``, which every release still supports, until it is read.
"""

from __future__ import annotations

from typing import TypeGuard
from gpuops.frozen import frozen

SERVE, LAUNCH_SERVER = "serve", "launch_server"
LAUNCH_SERVER_WORDS = ("-m", "sglang.launch_server")
_MAX_TEXT = 4096


@frozen
class LaunchEntry:
    """What a python's release recommends: ``serve`` (with ``script``) or ``launch_server``, and why."""

    python: str
    entrypoint: str
    script: str | None
    why: str

    @property
    def words(self) -> tuple[str, ...]:
        if self.entrypoint == SERVE and self.script:
            return (self.script, SERVE)
        return LAUNCH_SERVER_WORDS


def parse_entry(data: object) -> LaunchEntry | None:
    """One answer of the host module, checked (a host's answer is untrusted); None when it is not one."""
    if not isinstance(data, dict):
        return None
    python, entrypoint, script, why = (data.get(k) for k in ("python", "entrypoint", "script", "why"))
    if not _plain(python) or not isinstance(entrypoint, str) or entrypoint not in (SERVE, LAUNCH_SERVER) \
            or not isinstance(why, str):
        return None
    if entrypoint == SERVE and not (_plain(script) and str(script).startswith("/")):
        return None
    return LaunchEntry(python=str(python), entrypoint=entrypoint, script=str(script) if entrypoint == SERVE else None,
                       why=why[:300])


def _plain(text: object) -> TypeGuard[str]:
    return isinstance(text, str) and 0 < len(text) <= _MAX_TEXT and not any(c in text for c in "\n\r\x00")
