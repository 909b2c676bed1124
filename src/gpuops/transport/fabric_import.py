"""Import Fabric without the test-only half of invoke it drags in.

``invoke.context`` does ``from unittest.mock import Mock`` at import time, for its ``MockContext``
(a testing aid gpuops never uses); ``unittest.mock`` in turn imports ``asyncio``, ``unittest`` and
more: about half of what ``import invoke`` costs, paid by every SSH command. While Fabric is
imported, ``unittest.mock`` is served by a stand-in whose ``Mock`` imports the real one when it is
first called, then the stand-in is removed again, so anyone importing ``unittest.mock`` afterwards
gets the real module and ``MockContext`` still works.

Called from the main thread before any connection thread starts (``prepare_ssh``).
"""

from __future__ import annotations

import sys
import types
from typing import Any

_MOCK = "unittest.mock"


def _real_mock(*args: Any, **kwargs: Any) -> Any:
    from unittest.mock import Mock

    return Mock(*args, **kwargs)


def import_fabric() -> None:
    if "fabric" in sys.modules or _MOCK in sys.modules:
        import fabric  # noqa: F401  (already there, or the real mock is: nothing to save)

        return
    stand_in = types.ModuleType(_MOCK, "gpuops: stands in for unittest.mock while fabric is imported")
    stand_in.Mock = _real_mock  # type: ignore[attr-defined]
    sys.modules[_MOCK] = stand_in
    try:
        import fabric  # noqa: F401
    finally:
        if sys.modules.get(_MOCK) is stand_in:
            del sys.modules[_MOCK]
