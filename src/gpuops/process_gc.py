"""The cyclic garbage collector while a gpuops command loads its modules.

Loading a command's modules (gpuops' own, click, and for SSH hosts fabric, paramiko and
cryptography) allocates some 60k objects that live as long as the process. CPython's collector
scans young objects every 700 allocations and again when they move up a generation, so start-up
paid ~100 collections that found almost nothing to free: measured 20-26 ms of CPU in a lab
``gpuops apply nccl-env`` of ~0.35 s. While a command loads, the collector is off; after, what was
loaded is frozen (``gc.freeze``: kept out of every later collection, as ``cli.py`` does at exit) and
the collector is back on for the command's own work, however long it runs.

Only the ``gpuops`` command turns this on (``for_this_command``): a program that imports gpuops
as a library (pytest, the Ansible bridge) keeps its collector as it set it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_active = False


def for_this_command() -> None:
    """Called once by the command-line entry point, before the command's modules load."""
    global _active
    _active = True


@contextmanager
def loading_modules(name: str) -> Iterator[None]:
    """Around the import of module ``name`` and all it imports: no collections during it, none of
    what it loaded scanned after it. Once ``name`` is loaded (a later call), nested, or with the
    collector already off, it leaves the collector be: a long command that connects again and again
    must not freeze the garbage its own work left."""
    if not _active or not gc.isenabled() or name in sys.modules:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
