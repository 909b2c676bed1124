"""A run's extra vars (``-e``): read and checked once, at the boundary (the CLI, the Ansible bridge,
tune), into ``ExtraVars``, the value that flows down to every host; and a host's variables for the
run: its inventory vars under the extra vars.

Checked first: before they are hashed for a kept no-op plan or discovery (apply/noop_memo.py), used
to pick a python for the gather (facts/python_select.py), or planned with; a bad one is one line
naming the variable, and nothing is reached."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuops.extravars import merged
from gpuops.plan.roles import load_role_tree
from gpuops.plan.varcheck import check_extra_vars

if TYPE_CHECKING:
    from gpuops.inventory import Host


class ExtraVars(Mapping[str, Any]):
    """The run's ``-e`` variables once checked for its role (read-only). Made by ``checked`` (or ``none``)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = MappingProxyType(dict(values))

    @classmethod
    def checked(cls, role: str, values: Mapping[str, Any]) -> "ExtraVars":
        """``values`` checked against what ``role`` and the roles it includes read: a mapping or list
        variable given as text is refused (``GpuopsError``, one line). The warnings for variables no
        task reads come with each host's plan, as before."""
        check_extra_vars(role, load_role_tree(role), values)
        return cls(values)

    @classmethod
    def none(cls) -> "ExtraVars":
        """No ``-e`` (``gpuops rollback`` finishing a split deployment first): nothing to check."""
        return cls({})

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ExtraVars({sorted(self._values)})"  # names only: values may be secrets

    def for_host(self, host: "Host") -> dict[str, Any]:
        """The host's variables for this run (Ansible's precedence: ``-e`` wins)."""
        return merged(host, self)
