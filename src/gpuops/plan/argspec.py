"""What a task module accepts, declared beside its planner (Ansible's ``argument_spec``).

Each planner in ``plan/modules.py`` carries a ``ModuleSpec`` (``@declares(...)``); the role loader
checks every task against it before any host is reached (an unknown argument names the closest
valid one; a missing required one; a literal of the wrong type), the planner checks the rendered
values again (a ``{{ template }}`` has its type only then), and roles/README.md's module table is
generated from the same specs (``module_table``; a unit test keeps the two equal). There is no
second table.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import TypeVar

from gpuops.errors import GpuopsError
from gpuops.frozen import frozen

F = TypeVar("F", bound=Callable[..., object])


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value))
    except ValueError:
        return False
    return True


# kind -> (what a value of it looks like, for messages; the test on a value)
KINDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "text": ("a string", lambda v: isinstance(v, (str, int, float)) and not isinstance(v, bool)),
    "mapping": ("a mapping", lambda v: isinstance(v, Mapping)),
    "list": ("a list", lambda v: isinstance(v, (list, tuple))),
    # gate_patch reads "true"/"yes"/"1" as true too (a -e value arrives as text)
    "bool": ("true or false", lambda v: isinstance(v, (bool, str))),
    "number": ("a number", _is_number),
    # YAML reads 0644 as the int 420 and "0644" as text: normalize_mode takes both
    "mode": ("a file mode such as \"0644\"", lambda v: isinstance(v, (str, int)) and not isinstance(v, bool)),
    "expressions": ("an expression or a list of them",
                    lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(e, str) for e in v))),
    "any": ("any value", lambda v: True),
}


class RoleError(GpuopsError):
    """A role file that gpuops cannot use: names the file, the task and the problem (one line)."""


# A task's arguments as its planner gets them: rendered, each checked to be of its declared kind
# (``check_rendered``), defaults added (``ModuleSpec.with_defaults``); narrowed where read.
TaskArgs = dict[str, object]

NO_DEFAULT = object()  # an optional argument without a default: absent means absent


@frozen
class Arg:
    """An argument a task module accepts: its name, kind (one of ``KINDS``), whether it is required, its default."""

    name: str
    kind: str = "text"
    required: bool = False
    doc: str = ""  # shown in roles/README.md after the name: "absolute", "literal", ...
    default: object = NO_DEFAULT  # given to the planner when the task leaves the argument out

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"argument {self.name}: unknown kind {self.kind!r} (kinds: {', '.join(KINDS)})")


@frozen
class ModuleSpec:
    """What one task module accepts (``@declares`` on its planner): its arguments, what it plans, and where and
    how a task may use it; roles/README.md's module table is made from these."""

    name: str
    args: tuple[Arg, ...]
    plans: str  # what the module plans (roles/README.md's third column)
    handler_only: bool = False  # may only appear in handlers.yml (and handlers only use these)
    shorthand: str | None = None  # a plain value given instead of a mapping is this argument
    shorthand_kinds: tuple[type, ...] = (str,)

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.args if a.name == name), None)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.args]

    def with_defaults(self, args: Mapping[str, object]) -> dict[str, object]:
        """``args`` plus the declared default of every argument the task left out."""
        defaults = {a.name: a.default for a in self.args if a.default is not NO_DEFAULT and a.name not in args}
        return {**args, **defaults}


def number_arg(value: object) -> int | float | str:
    """A ``number`` argument as ``check_rendered`` let it through: a number, or text that reads as one."""
    if isinstance(value, (int, float, str)):
        return value
    raise TypeError(f"{type(value).__name__} is not a number")


def list_arg(value: object) -> list[object]:
    """A ``list`` argument's items (none when it was left out)."""
    return list(value) if isinstance(value, (list, tuple)) else []


def declares(spec: ModuleSpec) -> Callable[[F], F]:
    """Attach ``spec`` to the function that implements the module (``function.spec``)."""

    def attach(function: F) -> F:
        setattr(function, "spec", spec)  # noqa: B010  (a function's own attribute; read by spec_of)
        return function

    return attach


def spec_of(function: Callable[..., object]) -> ModuleSpec:
    """The ``ModuleSpec`` that ``@declares`` attached to ``function``."""
    spec = getattr(function, "spec", None)
    if not isinstance(spec, ModuleSpec):
        raise TypeError(f"{getattr(function, '__name__', function)!r} declares no module (@declares)")
    return spec


def closest(name: str, choices: list[str]) -> str | None:
    found = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return found[0] if found else None


def _is_template(value: object) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def check_task_args(spec: ModuleSpec, raw: object, where: str) -> dict[str, object]:
    """The arguments of a task as written in its role file, checked against ``spec``.

    Literal values are type-checked here; a ``{{ template }}`` only once rendered (``check_rendered``).
    """
    if spec.shorthand is not None and isinstance(raw, spec.shorthand_kinds):
        raw = {spec.shorthand: raw}
    if not isinstance(raw, dict):
        raise RoleError(f"{where}: the arguments of {spec.name} must be a mapping")
    for key in raw:
        if spec.arg(str(key)) is None:
            guess = closest(str(key), spec.names)
            hint = f"did you mean {guess!r}? " if guess else ""
            raise RoleError(f"{where}: unknown key {key!r} for {spec.name} ({hint}arguments: {', '.join(sorted(spec.names))})")
    missing = [a.name for a in spec.args if a.required and raw.get(a.name) is None]
    if missing:
        raise RoleError(f"{where}: {spec.name} needs {', '.join(missing)}")
    for arg in spec.args:
        if arg.name in raw and raw[arg.name] is not None and not _is_template(raw[arg.name]):
            _check_kind(spec, arg, raw[arg.name], where)
    return raw


def check_rendered(spec: ModuleSpec, args: Mapping[str, object], where: str) -> None:
    """The rendered arguments of a task (what its planner receives) against their declared kinds."""
    for arg in spec.args:
        value = args.get(arg.name)
        if value is None:
            if arg.required and arg.name in args:
                raise RoleError(f"{where}: {spec.name} needs {arg.name} (it rendered to nothing)")
            continue
        _check_kind(spec, arg, value, where)


def _check_kind(spec: ModuleSpec, arg: Arg, value: object, where: str) -> None:
    shown, test = KINDS[arg.kind]
    if not test(value):
        raise RoleError(f"{where}: {arg.name} of {spec.name} must be {shown}, not {type(value).__name__} {_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# The kinds worth naming in the docs (a "text" argument is the common case).
_KIND_LABELS = {"mapping": "mapping", "list": "list", "bool": "true/false", "number": "number"}


def _default_text(value: object) -> str:
    if isinstance(value, bool):
        return "default `true`" if value else "default `false`"
    return f"default `{value}`"


def _arg_cell(arg: Arg) -> str:
    default = _default_text(arg.default) if arg.default is not NO_DEFAULT else ""
    notes = [n for n in ("required" if arg.required else "", _KIND_LABELS.get(arg.kind, ""), arg.doc, default) if n]
    return f"`{arg.name}`" + (f" ({', '.join(notes)})" if notes else "")


TABLE_MARK = "<!-- generated from the modules' specs (src/gpuops/plan/modules.py): scripts/module-docs -->"


def with_module_table(readme: str, table: str) -> str:
    """``readme`` with the table after ``TABLE_MARK`` (up to the next blank line) replaced by ``table``."""
    start = readme.index(TABLE_MARK) + len(TABLE_MARK) + 1
    end = readme.index("\n\n", start) + 1
    return readme[:start] + table + readme[end:]


def module_table(specs: Mapping[str, ModuleSpec]) -> str:
    """roles/README.md's module table (markdown), from the specs, in their declared order."""
    lines = ["| module | arguments | plans |", "| --- | --- | --- |"]
    for spec in specs.values():
        name = f"`{spec.name}`" + (" (handlers only)" if spec.handler_only else "")
        args = ", ".join(_arg_cell(a) for a in spec.args) or "-"
        lines.append(f"| {name} | {args} | {spec.plans} |")
    return "\n".join(lines) + "\n"
