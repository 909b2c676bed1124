"""A role as loaded (its tasks and handlers, defaults, dependencies): the values the planner and
every task module read. Loading and checking them is ``roles.py``, which sits above the modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class Task:
    name: str
    module: str
    args: Mapping[str, Any]
    where: str                         # "roles/x/tasks.yml, task 2 (name)"
    when: str | None = None
    notify: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)
    register: str | None = None


@dataclass(frozen=True)
class Role:
    name: str
    path: Path
    defaults: Mapping[str, Any]
    tasks: tuple[Task, ...]
    handlers: tuple[Task, ...]
    dependencies: tuple[str, ...]

    @property
    def templates_dir(self) -> Path:
        return self.path / "templates"
