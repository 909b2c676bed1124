"""No import circles in src/gpuops (issue 40), and one class per public name.

The graph is read with ``ast`` from every module of the package: imports at the top, inside
functions and under ``TYPE_CHECKING`` alike (a type-only arrow still says which module sits above
which). A circle is a set of modules that reach each other; each one found is listed with the
arrows (``a -> b (line)``) that close it, so the failure says what to move down.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from labtools import REPO_ROOT

SRC = REPO_ROOT / "src"
PACKAGE = SRC / "gpuops"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path): path for path in sorted(root.rglob("*.py")) if "__pycache__" not in path.parts}


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> dict[str, list[int]]:
    """The package's modules ``name`` imports anywhere in its file -> the lines that import each.
    ``from a import b`` counts as importing ``a.b`` where that is a module, else ``a``."""
    is_package = path.name == "__init__.py"
    found: dict[str, list[int]] = defaultdict(list)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".") if is_package else name.split(".")[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            if target in modules and target != name:
                found[target].append(node.lineno)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, list[int]]]:
    modules = package_modules(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, dict[str, list[int]]]) -> str:
    members = set(component)
    arrows = [f"    {a} -> {b} (line {', '.join(map(str, lines))})"
              for a in component for b, lines in sorted(graph[a].items()) if b in members]
    return " <-> ".join(component) + "\n" + "\n".join(arrows)


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 200  # the whole package was read, not an empty folder
    found = circles(graph)
    assert found == [], "import circles (move what they share into the lower module):\n" + "\n".join(
        describe(component, graph) for component in found)


def test_a_circle_is_found_and_named_with_its_arrows(tmp_path: Path) -> None:
    # The detector itself: an in-function import closing a three-module ring, a relative import,
    # and a TYPE_CHECKING one are all arrows; a module importing only downwards is no circle.
    package = tmp_path / "gpuops"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from gpuops.sub import b\n")
    (package / "sub" / "b.py").write_text("from . import c\n")
    (package / "sub" / "c.py").write_text("def f():\n    from gpuops.sub.a import x\n")
    (package / "sub" / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuops.e import E\n")
    (package / "e.py").write_text("import gpuops.sub.d\n")
    (package / "low.py").write_text("import os\n")
    (package / "high.py").write_text("from gpuops import low\n")
    graph = {name: imports for name, imports in _graph_under(tmp_path).items()}
    found = circles(graph)
    assert found == [["gpuops.e", "gpuops.sub.d"], ["gpuops.sub.a", "gpuops.sub.b", "gpuops.sub.c"]]
    assert "gpuops.sub.c -> gpuops.sub.a (line 2)" in describe(found[1], graph)


def _graph_under(src: Path) -> dict[str, dict[str, list[int]]]:
    modules = {".".join(p.relative_to(src).with_suffix("").parts[:-1] if p.name == "__init__.py"
                        else p.relative_to(src).with_suffix("").parts): p for p in sorted(src.rglob("*.py"))}
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def public_classes(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Every public class name defined at a module's top -> the modules defining it."""
    where: dict[str, list[str]] = defaultdict(list)
    for name, path in package_modules(root).items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(name)
    return where


def test_one_class_per_public_name() -> None:
    # Two things called Host (or Fit, or Refused) make a reader and a grep follow the wrong one:
    # name the lesser one for what it is.
    where = public_classes()
    assert len(where) > 100
    twice = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert twice == {}, f"one public class name, several classes: {twice}"
