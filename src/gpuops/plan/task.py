"""A role as loaded (its tasks and handlers, defaults, dependencies): the values the planner and
every task module read. Loading and checking them is ``roles.py``, which sits above the modules."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Mapping
from gpuops.frozen import frozen

# Variables by name, from any source (role defaults, inventory, -e, task vars, registered results):
# YAML, JSON or rendered template values, each narrowed where a planner reads it.
Variables = Mapping[str, object]


@frozen
class Task:
    """One task of a role's tasks or handlers, as loaded: its module and arguments, and Ansible's ``when``,
    ``notify``, ``vars`` and ``register``."""

    name: str
    module: str
    args: Mapping[str, object]  # as written: checked against the module's spec, rendered when planned
    where: str                         # "roles/x/tasks.yml, task 2 (name)"
    when: str | None = None
    notify: tuple[str, ...] = ()
    vars: Variables = field(default_factory=dict)
    register: str | None = None


@frozen
class Role:
    """A role as loaded from its directory: its defaults, tasks, handlers and the roles it depends on."""

    name: str
    path: Path
    defaults: Variables
    tasks: tuple[Task, ...]
    handlers: tuple[Task, ...]
    dependencies: tuple[str, ...]

    @property
    def templates_dir(self) -> Path:
        return self.path / "templates"
