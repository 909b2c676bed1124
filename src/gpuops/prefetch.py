"""Import modules a command will need later while it waits on the network anyway.

A host command spends most of its wall time blocked on the remote (key exchange, the exec); its
local parsing then starts by importing the modules that judge and render (tens of milliseconds on
a short command). ``prefetch`` imports them in a daemon thread during that wait; the caller
``join``s the handle before it needs them, so the main thread never imports concurrently with the
prefetch (no lock-order surprises between the two). A module that fails to import here is simply
left alone: the caller's own import raises the real error where it always did.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass


@dataclass
class Prefetch:
    thread: threading.Thread | None

    def join(self) -> None:
        """Wait until the prefetch is done (returns at once when it already is)."""
        if self.thread is not None:
            self.thread.join()


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the caller's own import reports it
            return


_STARTED: dict[tuple[str, ...], Prefetch] = {}
_LOCK = threading.Lock()


def prefetch(*names: str) -> Prefetch:
    """Start importing ``names`` (in order) in the background; ``join()`` the result before use.

    Once per process for the same names: hosts worked on in parallel share one prefetch (and each
    joins it), rather than several threads importing the same modules at once."""
    import sys

    with _LOCK:
        started = _STARTED.get(names)
        if started is not None:
            return started
        if all(n in sys.modules for n in names):
            handle = Prefetch(None)
        else:
            thread = threading.Thread(target=_import_all, args=(names,), name="gpuops-prefetch", daemon=True)
            handle = Prefetch(thread)
            thread.start()
        _STARTED[names] = handle
        return handle
