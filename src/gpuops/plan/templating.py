"""Jinja2 for roles, strict: an undefined variable is an error naming it and the template.

Only role files (defaults, task arguments, templates) are templates. Values from the inventory and
from ``-e`` are data: a ``{{`` in them stays literal text, so a hostile value cannot reach Jinja.
Role defaults may refer to other variables; they are rendered lazily, when used, like Ansible's.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

from gpuops.errors import GpuopsError
from gpuops.plan.task import Variables
from gpuops.release.flags import merge_flags
from gpuops.release.flags import rename_flags
from gpuops.release.flags import drop_flags
from gpuops.frozen import frozen

if TYPE_CHECKING:  # jinja2 is imported when a Templar is made (a recalled no-op plan never makes one)
    from jinja2 import Template
    from jinja2.environment import TemplateExpression

_SINGLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.DOTALL)


class TemplateError(GpuopsError):
    """A template or expression that cannot be rendered: names the variable and the file."""


@frozen
class Layer:
    """One source of variables; ``templated`` layers come from role files and are rendered on use."""

    values: Variables
    templated: bool
    origin: str


class VarScope:
    """Variables in precedence order (later layers win), resolved lazily and memoised."""

    def __init__(self, templar: "Templar", layers: Iterable[Layer]):
        self.templar = templar
        self.layers = tuple(layers)
        self._cache: dict[str, object] = {}
        self._resolving: list[str] = []

    def child(self, *layers: Layer) -> "VarScope":
        return VarScope(self.templar, self.layers + layers)

    def _winning(self, name: str) -> Layer | None:
        for layer in reversed(self.layers):
            if name in layer.values:
                return layer
        return None

    def __contains__(self, name: str) -> bool:
        return self._winning(name) is not None

    def names(self) -> set[str]:
        return {name for layer in self.layers for name in layer.values}

    def get(self, name: str) -> object:
        if name in self._cache:
            return self._cache[name]
        layer = self._winning(name)
        if layer is None:
            raise KeyError(name)
        value = layer.values[name]
        if layer.templated:
            if name in self._resolving:
                chain = " -> ".join(self._resolving + [name])
                raise TemplateError(f"{layer.origin}: variable {name} refers to itself ({chain})")
            self._resolving.append(name)
            try:
                # A default that refers to itself (x: "{{ x + [1] }}") means "the layer below".
                position = next(i for i, candidate in enumerate(self.layers) if candidate is layer)
                below = VarScope(self.templar, self.layers[:position])
                scope = _Overlay(self, name, below)
                value = self.templar.render_value(value, scope, f"{layer.origin} (variable {name})")
            finally:
                self._resolving.pop()
        self._cache[name] = value
        return value

    def resolved(self) -> dict[str, object]:
        """Every variable, rendered (for hashing and the journal). Unrenderable ones are skipped."""
        out: dict[str, object] = {}
        for name in sorted(self.names()):
            try:
                out[name] = self.get(name)
            except GpuopsError:
                continue
        return out


class _Overlay(VarScope):
    """The scope seen while rendering variable ``name``: ``name`` itself comes from below."""

    def __init__(self, scope: VarScope, name: str, below: VarScope):
        self.__dict__.update(scope.__dict__)
        self._self_name = name
        self._below = below

    def get(self, name: str) -> object:
        if name == self._self_name:
            return self._below.get(name)
        return VarScope.get(self, name)

    def __contains__(self, name: str) -> bool:
        if name == self._self_name:
            return name in self._below
        return VarScope.__contains__(self, name)


def _combine(*dicts: Mapping[str, object]) -> dict[str, object]:
    merged: dict[str, object] = {}
    for item in dicts:
        if item is None:
            continue
        if not isinstance(item, Mapping):
            raise TypeError(f"combine expects mappings, got {type(item).__name__}")
        merged.update(item)
    return merged


def _unique_flags(args: Iterable[object]) -> list[str]:
    """Launch flags without repeating a bare flag that is already there (idempotent merges)."""
    out: list[str] = []
    for arg in args:
        text = str(arg)
        if text.startswith("--") and text in out and "=" not in text:
            continue
        out.append(text)
    return out


def _merge_flags(*groups: Iterable[object]) -> list[str]:
    return merge_flags(*groups)


def _drop_flags(args: Iterable[object], names: Iterable[object]) -> list[str]:
    return drop_flags([str(a) for a in args], names)


def _rename_flags(args: Iterable[object], renames: Mapping[str, Iterable[object]]) -> list[str]:
    return rename_flags([str(a) for a in args], {str(k): [str(w) for w in v] for k, v in (renames or {}).items()})


def _systemd_quote(word: object) -> str:
    text = str(word).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{text}"'


class _Compiled:
    """One Jinja environment over some template dirs, with what it parsed and compiled: shared by
    every Templar over the same dirs in this process. An apply plans a role twice (discovery, then
    the plan), a deployment or tune once per host: each pass compiled the same expressions and
    strings again (a lab `apply sglang-service`: 60 expressions and 69 strings compiled, 34 and 39
    now). What is kept is keyed by its source text, the environment's own template cache checks
    each file's mtime, and the filters and tests hold no state."""

    def __init__(self, search_dirs: tuple[str, ...]):
        import jinja2

        self.loader = jinja2.FileSystemLoader(list(search_dirs))
        self.env = jinja2.Environment(
            loader=self.loader,
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            autoescape=False,
        )
        self.env.filters.update(
            combine=_combine,
            shquote=lambda v: shlex.quote(str(v)),
            systemd_quote=_systemd_quote,
            to_json=lambda v: json.dumps(v, sort_keys=True),
            unique_flags=_unique_flags,
            merge_flags=_merge_flags,
            rename_flags=_rename_flags,
            drop_flags=_drop_flags,
        )
        self.env.tests["match"] = lambda value, pattern: re.match(pattern, str(value)) is not None
        self.env.tests["mapping"] = lambda value: isinstance(value, Mapping)
        # Parse and compile each source once (a plan renders the same few many times).
        self.names: dict[str, frozenset[str]] = {}
        self.expressions: dict[str, TemplateExpression] = {}
        self.strings: dict[str, Template] = {}


@functools.lru_cache(maxsize=32)
def _compiled_for(search_dirs: tuple[str, ...]) -> _Compiled:
    return _Compiled(search_dirs)


class Templar:
    """Renders role templates and expressions against a ``VarScope``."""

    def __init__(self, search_dirs: Iterable[Path]):
        import jinja2

        self._jinja2 = jinja2
        compiled = _compiled_for(tuple(str(d) for d in search_dirs))
        self._loader = compiled.loader
        self.env = compiled.env
        self._names = compiled.names
        self._expressions = compiled.expressions
        self._strings = compiled.strings

    def _context(self, source: str, scope: VarScope, where: str) -> dict[str, object]:
        from jinja2 import meta

        names = self._names.get(source)
        if names is None:
            try:
                ast = self.env.parse(source)
            except self._jinja2.TemplateSyntaxError as exc:
                raise TemplateError(f"{where}: template syntax error: {exc.message} (line {exc.lineno})") from None
            names = self._names[source] = frozenset(meta.find_undeclared_variables(ast))
        return {name: scope.get(name) for name in names if name in scope}

    def _fail(self, exc: Exception, where: str) -> TemplateError:
        if isinstance(exc, self._jinja2.UndefinedError):
            match = re.search(r"'([^']+)' is undefined", str(exc))
            if match:
                return TemplateError(f"{where}: undefined variable '{match.group(1)}'")
            return TemplateError(f"{where}: {exc}")
        return TemplateError(f"{where}: {type(exc).__name__}: {exc}")

    def render_string(self, text: str, scope: VarScope, where: str) -> object:
        """A string from a role file: a lone ``{{ expr }}`` keeps its type (lists stay lists)."""
        if "{{" not in text and "{%" not in text:
            return text
        single = _SINGLE_EXPR.match(text)
        if single:
            return self.evaluate(single.group("expr"), scope, where)
        context = self._context(text, scope, where)
        try:
            template = self._strings.get(text)
            if template is None:
                template = self._strings[text] = self.env.from_string(text)
            return template.render(context)
        except GpuopsError:
            raise
        except Exception as exc:
            raise self._fail(exc, where) from None

    def evaluate(self, expression: str, scope: VarScope, where: str) -> object:
        """A bare Jinja expression (``when``, ``that``) to a Python value."""
        expression = expression.strip()
        context = self._context("{{ " + expression + " }}", scope, where)
        try:
            compiled = self._expressions.get(expression)
            if compiled is None:
                compiled = self._expressions[expression] = self.env.compile_expression(expression, undefined_to_none=False)
            value = compiled(**context)
        except GpuopsError:
            raise
        except self._jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"{where}: bad expression {expression!r}: {exc.message}") from None
        except Exception as exc:
            raise self._fail(exc, where) from None
        if isinstance(value, self._jinja2.Undefined):
            # StrictUndefined raises on use, not on return: force it so the name is reported.
            try:
                str(value)
            except Exception as exc:
                raise self._fail(exc, where) from None
        return value

    def render_value(self, value: object, scope: VarScope, where: str) -> object:
        if isinstance(value, str):
            return self.render_string(value, scope, where)
        if isinstance(value, Mapping):
            return {k: self.render_value(v, scope, where) for k, v in value.items()}
        if isinstance(value, list):
            return [self.render_value(v, scope, where) for v in value]
        return value

    def render_file(self, name: str, scope: VarScope, where: str) -> str:
        try:
            source, filename, _ = self._loader.get_source(self.env, name)
        except self._jinja2.TemplateNotFound:
            raise TemplateError(f"{where}: template {name} not found") from None
        context = self._context(source, scope, f"template {filename}")
        try:
            return self.env.get_template(name).render(context)
        except GpuopsError:
            raise
        except Exception as exc:
            raise self._fail(exc, f"template {filename} ({where})") from None
