"""Do work a command will need later while it waits on the network anyway.

A host command spends most of its wall time blocked on the remote (the exec); its local parsing
then starts with work that does not depend on what the host answers (inspect: reading and checking
the gate catalog, ~20 M instructions). ``prefetch`` runs such work in a daemon thread during that
wait; the caller ``join``s the handle before it needs the results, so the main thread never does the
same work concurrently with the prefetch. Work that fails here is simply left alone: the caller's
own call raises the real error where it always did.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Prefetch:
    """A handle on work started in the background (``thread`` None: nothing was started)."""

    thread: threading.Thread | None

    def join(self) -> None:
        """Wait until the prefetch is done (returns at once when it already is)."""
        if self.thread is not None:
            self.thread.join()


def _run_all(work: tuple[Callable[[], object], ...]) -> None:
    for step in work:
        try:
            step()
        except Exception:  # the caller's own call reports it
            return


_STARTED: dict[tuple[Callable[[], object], ...], Prefetch] = {}
_LOCK = threading.Lock()


def prefetch(*work: Callable[[], object]) -> Prefetch:
    """Start ``work`` (callables, in order) in the background; ``join()`` the result before use.

    Once per process for the same work: hosts worked on in parallel share one prefetch (and each
    joins it), rather than several threads doing the same work at once. The work must be worth
    doing once: a function whose result is cached (``load_catalog``), not one that returns a value."""
    with _LOCK:
        started = _STARTED.get(work)
        if started is not None:
            return started
        handle = Prefetch(None)
        if work:
            thread = threading.Thread(target=_run_all, args=(work,), name="gpuops-prefetch", daemon=True)
            handle = Prefetch(thread)
            thread.start()
        _STARTED[work] = handle
        return handle
