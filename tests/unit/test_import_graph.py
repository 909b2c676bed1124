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


# ---------------------------------------------------------------- the layers (docs/ARCHITECTURE.md)

# Top first; a module imports only from its own layer or below. Each entry is a package (``apply/``)
# or a top-level module (``memo.py``) of src/gpuops, as the diagram in docs/ARCHITECTURE.md writes
# them (test_the_architecture_diagram_lists_these_layers holds the two together).
LAYERS: list[tuple[str, ...]] = [
    ("commands/", "cli.py"),
    ("advise.py", "tune/", "bench/", "lab/", "ansible_bridge.py", "inspection.py"),
    ("apply/",),
    ("plan/",),
    ("facts/",),
    ("gates/", "pcie_ipc.py"),
    ("gather.py", "memo.py", "shipping/"),
    ("transport/",),
    ("inventory/", "secret_policy.py", "timings.py", "extravars.py", "multi_node.py"),
    ("remote/", "release/", "yamlfile.py", "errors.py", "nccl.py", "output.py", "desired_state.py", "role_paths.py",
     "prefetch.py", "termination.py", "time_limits.py", "process_gc.py", "frozen.py", "python_ast.py"),
]

# Arrows allowed up for now, each with the reason and what ends it.
UPWARD_ALLOWED: set[tuple[str, str]] = set()  # (lower, higher) arrows tolerated for now: none


def layer_of(module: str, layers: list[tuple[str, ...]] = LAYERS) -> int | None:
    """The layer's index counted from the bottom (0), None for a module no layer names."""
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package itself (gpuops/__init__.py: its start time only)
    entry = f"{parts[1]}/" if len(parts) > 2 or (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"
    for index, members in enumerate(layers):
        if entry in members:
            return len(layers) - 1 - index
    return None


def upward_arrows(graph: dict[str, dict[str, list[int]]], layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    found = []
    for source, targets in sorted(graph.items()):
        for target, lines in sorted(targets.items()):
            low, high = layer_of(source, layers), layer_of(target, layers)
            if low is not None and high is not None and high > low:
                found.append(f"{source} -> {target} (line {', '.join(map(str, sorted(set(lines))))})")
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in package_modules() if name != "gpuops" and layer_of(name) is None)
    assert unplaced == [], f"modules in no layer (place them in LAYERS and docs/ARCHITECTURE.md's diagram): {unplaced}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    # In-function and TYPE_CHECKING imports count: a deferred import still points up.
    graph = import_graph()
    allowed = {f"{a} -> {b}" for a, b in UPWARD_ALLOWED}
    found = [arrow for arrow in upward_arrows(graph) if arrow.split(" (line")[0] not in allowed]
    assert found == [], ("imports from a higher layer (move what the two share into the lower one):\n"
                         + "\n".join(found))
    still = {f"{a} -> {b}" for a, b in UPWARD_ALLOWED} - {arrow.split(" (line")[0] for arrow in upward_arrows(graph)}
    assert not still, f"allowed upward arrows that are gone (take them out of UPWARD_ALLOWED): {sorted(still)}"


def test_an_upward_arrow_is_found_in_a_function_too(tmp_path: Path) -> None:
    package = tmp_path / "gpuops"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def f():\n    from gpuops import high\n")
    (package / "high.py").write_text("from gpuops.low import a\n")
    (package / "same.py").write_text("from gpuops import high\n")
    layers = [("high.py", "same.py"), ("low/",)]
    graph = _graph_under(tmp_path)
    assert upward_arrows(graph, layers) == ["gpuops.low.a -> gpuops.high (line 2)"]


def diagram_layers(text: str) -> list[tuple[str, ...]]:
    """The layers as docs/ARCHITECTURE.md's diagram under "## Layers" lists them: per line, the
    packages (``name/``) and modules (``name.py``) before its description."""
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers = []
    for line in block.strip("\n").splitlines():
        names = []
        for word in line.split():
            if not (word.endswith("/") or word.endswith(".py")):
                break
            names.append(word)
        layers.append(tuple(names))
    return layers


def test_the_architecture_diagram_lists_these_layers() -> None:
    text = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert [set(layer) for layer in diagram_layers(text)] == [set(layer) for layer in LAYERS]
