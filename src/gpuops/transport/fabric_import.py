"""Import Fabric without the test-only half of invoke it drags in.

``invoke.context`` does ``from unittest.mock import Mock`` at import time, for its ``MockContext``
(a testing aid gpuops never uses); ``unittest.mock`` in turn imports ``asyncio``, ``unittest`` and
more: about half of what ``import invoke`` costs, paid by every SSH command. While Fabric is
imported, ``unittest.mock`` is served by a stand-in whose ``Mock`` imports the real one when it is
first called, then the stand-in is removed again, so anyone importing ``unittest.mock`` afterwards
gets the real module and ``MockContext`` still works.

The same is done for ``importlib.metadata``: paramiko's ``__init__`` imports it only to set
``__version__ = metadata.version("paramiko")``, and importing it (email, zipfile, csv, ...) and
searching ``sys.path`` for the distribution cost ~10 ms of every SSH command's CPU. While Fabric is
imported, a stand-in answers ``version("paramiko")`` from the ``paramiko-*.dist-info`` beside the
package that is about to be imported (the same ``Version:`` line importlib.metadata reads; the
version goes into paramiko's SSH banner); any other name or attribute loads the real module and
defers to it. When that dist-info cannot be found as exactly one, no stand-in is used.

Called from the main thread before any connection thread starts (``prepare_ssh``).
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

_MOCK = "unittest.mock"
_METADATA = "importlib.metadata"


def _real_mock(*args: Any, **kwargs: Any) -> Any:
    from unittest.mock import Mock

    return Mock(*args, **kwargs)


def _real_metadata() -> types.ModuleType:
    """The real importlib.metadata (the stand-in, if it is still registered, gives way to it)."""
    if not isinstance(sys.modules.get(_METADATA), _MetadataStandIn):
        import importlib.metadata

        return importlib.metadata
    del sys.modules[_METADATA]
    import importlib.metadata

    return importlib.metadata


class _MetadataStandIn(types.ModuleType):
    """``version(NAME)`` of the one distribution known here; everything else from the real module."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(_METADATA, "gpuops: stands in for importlib.metadata while fabric is imported")
        self._known = (name, version)

    def version(self, distribution_name: str) -> str:
        if distribution_name == self._known[0]:
            return self._known[1]
        return str(_real_metadata().version(distribution_name))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_real_metadata(), name)


def dist_info_version(package: str) -> str | None:
    """The ``Version:`` of the single ``<package>-*.dist-info`` beside the package's own directory
    (where pip installs both), or None when there is not exactly one or it cannot be read."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.submodule_search_locations:
        return None
    site = os.path.dirname(os.path.dirname(spec.origin))
    try:
        found = [n for n in os.listdir(site) if n.startswith(package + "-") and n.endswith(".dist-info")]
        if len(found) != 1:
            return None
        with open(os.path.join(site, found[0], "METADATA"), encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    break  # the headers end at the first blank line
                if line.startswith("Version:"):
                    return line[len("Version:"):].strip() or None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def import_fabric() -> None:
    if "fabric" in sys.modules or _MOCK in sys.modules:
        import fabric  # already there, or the real mock is: nothing to save

        return
    stand_in = types.ModuleType(_MOCK, "gpuops: stands in for unittest.mock while fabric is imported")
    stand_in.Mock = _real_mock  # type: ignore[attr-defined]
    sys.modules[_MOCK] = stand_in
    metadata: _MetadataStandIn | None = None
    if _METADATA not in sys.modules:
        version = dist_info_version("paramiko")
        if version is not None:
            metadata = _MetadataStandIn("paramiko", version)
            sys.modules[_METADATA] = metadata
    try:
        import fabric  # noqa: F401
    finally:
        if sys.modules.get(_MOCK) is stand_in:
            del sys.modules[_MOCK]
        if metadata is not None and sys.modules.get(_METADATA) is metadata:
            del sys.modules[_METADATA]
