"""Roles on disk: ``roles/<name>/{tasks,defaults,handlers}.yml``, ``meta/main.yml``, ``templates/``.

Loading checks the vocabulary up front (unknown module, unknown key, bad type), so a typo in a role
is one error naming the file and the task, before anything touches a host.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from gpuops.plan.argspec import RoleError, check_task_args, closest
from gpuops.plan.modules import SPECS
from gpuops.role_paths import default_roles_path, installed_data_dir, project_root, shared_templates_dirs  # noqa: F401  (re-exported)
from gpuops.plan.task import Role, Task
from gpuops.yamlfile import load_yaml_file

__all__ = ["Role", "RoleError", "Task", "load_role", "load_role_tree"]

T = TypeVar("T")

TASK_KEYS = {"name", "when", "notify", "vars", "register"}
# The modules and their arguments are declared beside their planners (plan/modules.py: SPECS).
HANDLER_MODULES = {name for name, spec in SPECS.items() if spec.handler_only}


def _read_yaml(path: Path, expected: type[T], empty: T) -> T:
    if not path.exists():
        return empty
    data = load_yaml_file(path, error=RoleError)
    if data is None:
        return empty
    if not isinstance(data, expected):
        raise RoleError(f"{path}: expected a {expected.__name__} at the top, got {type(data).__name__}")
    return data


def _display(path: Path, base: Path) -> str:
    """``roles/<role>/tasks.yml``: short, and still findable from the repository or the cwd."""
    try:
        return str(path.relative_to(base.parent))
    except ValueError:
        return str(path)


def _parse_task(raw: object, path: Path, index: int, handler: bool, shown: str = "") -> Task:
    where = f"{shown or path}, {'handler' if handler else 'task'} {index + 1}"
    if not isinstance(raw, dict):
        raise RoleError(f"{where}: a task must be a mapping")
    if "name" in raw:
        where += f" ({raw['name']})"
    modules = [key for key in raw if key not in TASK_KEYS]
    unknown = [key for key in modules if key not in SPECS]
    if unknown:
        guess = closest(str(unknown[0]), list(SPECS) + sorted(TASK_KEYS))
        raise RoleError(
            f"{where}: unknown module or key {unknown[0]!r} ({f'did you mean {guess!r}? ' if guess else ''}"
            f"modules: {', '.join(sorted(SPECS))}; task keys: {', '.join(sorted(TASK_KEYS))})"
        )
    if len(modules) != 1:
        raise RoleError(f"{where}: a task needs exactly one module, found {modules or 'none'}")
    module = modules[0]
    if handler and module not in HANDLER_MODULES:
        raise RoleError(f"{where}: handlers may only use {', '.join(sorted(HANDLER_MODULES))}, not {module}")
    args = check_task_args(SPECS[module], raw[module], where)
    notify = raw.get("notify", ())
    if isinstance(notify, str):
        notify = (notify,)
    if not isinstance(notify, (list, tuple)) or not all(isinstance(n, str) for n in notify):
        raise RoleError(f"{where}: notify must be a handler name or a list of them")
    task_vars = raw.get("vars") or {}
    if not isinstance(task_vars, dict):
        raise RoleError(f"{where}: vars must be a mapping")
    when = raw.get("when")
    if isinstance(when, list):
        when = " and ".join(f"({w})" for w in when)
    if when is not None and not isinstance(when, (str, bool)):
        raise RoleError(f"{where}: when must be an expression")
    register = raw.get("register")
    if register is not None and not (isinstance(register, str) and register.isidentifier()):
        raise RoleError(f"{where}: register must be a variable name")
    return Task(
        name=str(raw.get("name") or module), module=module, args=args, where=where,
        when=None if when is None else str(when), notify=tuple(notify), vars=task_vars, register=register,
    )


def load_role(name: str, search: list[Path] | None = None) -> Role:
    if not name or "/" in name or name.startswith("."):
        raise RoleError(f"bad role name {name!r}")
    search = search if search is not None else default_roles_path()
    for base in search:
        path = base / name
        if path.is_dir():
            break
    else:
        available = sorted({p.name for base in search if base.is_dir() for p in base.iterdir() if p.is_dir()})
        raise RoleError(f"role {name} not found in {', '.join(str(s) for s in search)} (available: {', '.join(available) or 'none'})")
    tasks_file = path / "tasks.yml"
    if not tasks_file.exists() and (path / "tasks" / "main.yml").exists():
        tasks_file = path / "tasks" / "main.yml"
    if not tasks_file.exists():
        raise RoleError(f"{path}: a role needs tasks.yml")
    defaults_file = path / "defaults.yml"
    if not defaults_file.exists():
        defaults_file = path / "defaults" / "main.yml"
    handlers_file = path / "handlers.yml"
    if not handlers_file.exists():
        handlers_file = path / "handlers" / "main.yml"
    meta = _read_yaml(path / "meta" / "main.yml", dict, {})
    deps = meta.get("dependencies", []) or []
    if not isinstance(deps, list):
        raise RoleError(f"{path / 'meta' / 'main.yml'}: dependencies must be a list")
    dep_names: list[str] = []
    for dep in deps:
        named = dep if isinstance(dep, str) else (dep.get("role") if isinstance(dep, dict) else None)
        if not isinstance(named, str):
            raise RoleError(f"{path / 'meta' / 'main.yml'}: each dependency is a role name or {{role: NAME}}")
        dep_names.append(named)
    tasks = _read_yaml(tasks_file, list, [])
    handlers = _read_yaml(handlers_file, list, [])
    return Role(
        name=name,
        path=path,
        defaults=_read_yaml(defaults_file, dict, {}),
        tasks=tuple(_parse_task(t, tasks_file, i, False, _display(tasks_file, base)) for i, t in enumerate(tasks)),
        handlers=tuple(_parse_task(t, handlers_file, i, True, _display(handlers_file, base)) for i, t in enumerate(handlers)),
        dependencies=tuple(dep_names),
    )


def load_role_tree(name: str, search: list[Path] | None = None) -> dict[str, Role]:
    """The role and every role it depends on or includes (include_role names must be literal)."""
    roles: dict[str, Role] = {}
    pending = [name]
    while pending:
        current = pending.pop()
        if current in roles:
            continue
        role = load_role(current, search)
        roles[current] = role
        pending.extend(role.dependencies)
        for task in role.tasks:
            if task.module == "include_role":
                included = task.args["name"]
                if not isinstance(included, str) or "{{" in included:
                    raise RoleError(f"{task.where}: include_role name must be a literal role name")
                pending.append(included)
    return roles
