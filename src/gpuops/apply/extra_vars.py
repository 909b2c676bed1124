"""A host's variables for one run: its inventory vars under the run's extra vars (``-e``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from gpuops.inventory import Host


def merged(host: "Host", extra: Mapping[str, Any]) -> dict[str, Any]:
    """The host's variables with the extra vars over them (Ansible's precedence: ``-e`` wins)."""
    return {**dict(host.vars or {}), **dict(extra)}
