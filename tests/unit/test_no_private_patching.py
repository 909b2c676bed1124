"""No line of gpuops touches another library's private names (issue 28): every such patch breaks
silently on the library's next release. Read from the source with ``ast``, not by running it:

  - ``mod._name`` / ``mod.Class._name`` where ``mod`` is an imported non-gpuops module or name
  - ``super()._name`` (reaching into a base class's private method)
  - a method overriding a private name (``_name``, not ``__dunder__``) of another library's base class
  - ``obj.__class__ = ...`` (swapping a live object's class) and ``sys.modules[...] = ...`` (stand-ins)
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import gpuops

SRC = Path(gpuops.__file__).parent
# Underscore names that are a library's documented public API.
PUBLIC = {("os", "_exit")}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _foreign_names(tree: ast.AST) -> dict[str, tuple[str, str | None]]:
    """Local names bound by imports of modules outside gpuops: name -> (module, attribute or None)."""
    names: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "gpuops":
                    local = alias.asname or alias.name.split(".")[0]
                    names[local] = (alias.name if alias.asname else alias.name.split(".")[0], None)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] != "gpuops":
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module or "", alias.name)
    return names


def _resolve(expr: ast.expr, foreign: dict[str, tuple[str, str | None]]) -> Any:
    """The object a base-class expression like ``paramiko.Transport`` names, or None."""
    chain: list[str] = []
    while isinstance(expr, ast.Attribute):
        chain.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name) or expr.id not in foreign:
        return None
    module, attribute = foreign[expr.id]
    try:
        value = importlib.import_module(module)
        for name in ([attribute] if attribute else []) + chain:
            value = getattr(value, name)
    except (ImportError, AttributeError):
        return None
    return value


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def violations(text: str, where: str) -> list[str]:
    tree = ast.parse(text, filename=where)
    foreign = _foreign_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root(node.value)
            if isinstance(root, ast.Name) and root.id in foreign and (root.id, node.attr) not in PUBLIC:
                found.append(f"{where}:{node.lineno}: {root.id}...{node.attr}")
            elif isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "super":
                found.append(f"{where}:{node.lineno}: super().{node.attr}")
        if isinstance(node, ast.ClassDef):
            bases = [b for b in (_resolve(e, foreign) for e in node.bases) if isinstance(b, type)]
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name) \
                        and any(hasattr(b, item.name) for b in bases):
                    found.append(f"{where}:{item.lineno}: {node.name}.{item.name} overrides a private name")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "__class__":
                    found.append(f"{where}:{node.lineno}: assigns __class__")
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) \
                        and target.value.attr == "modules" and isinstance(target.value.value, ast.Name) \
                        and target.value.value.id == "sys":
                    found.append(f"{where}:{node.lineno}: plants a module in sys.modules")
    return found


def test_no_module_of_gpuops_touches_another_librarys_private_names() -> None:
    found = [v for path in sorted(SRC.rglob("*.py")) for v in violations(path.read_text(), str(path.relative_to(SRC)))]
    assert not found, "\n".join(found)


def test_the_check_sees_each_kind_of_patch() -> None:
    # Each patch gpuops once carried, in miniature: the check must name every one.
    samples = {
        "import atexit\natexit._run_exitfuncs()\n": "atexit..._run_exitfuncs",
        "import paramiko\nx = paramiko.Transport._preferred_ciphers\n": "paramiko..._preferred_ciphers",
        "import paramiko\nclass T(paramiko.Transport):\n    def _verify_key(self, k, s):\n        super()._verify_key(k, s)\n":
            "T._verify_key overrides a private name",
        "def f(sock, cls):\n    sock.__class__ = cls\n": "assigns __class__",
        "import sys, types\nsys.modules['unittest.mock'] = types.ModuleType('m')\n": "plants a module in sys.modules",
    }
    for text, expected in samples.items():
        assert any(expected in v for v in violations(text, "sample.py")), (text, violations(text, "sample.py"))
    # and leaves alone what is public or gpuops' own
    assert violations("from gpuops.lab import sshd\nsshd._private()\nclass A:\n    def _mine(self):\n        pass\n", "ok.py") == []


def test_no_source_line_names_the_patched_internals_gpuops_once_used() -> None:
    # By text too: a private name reached through a variable (``transport_class._preferred_ciphers``,
    # ``getattr(cls, "_preferred_kex")``) is not an import the check above can follow.
    import re

    pattern = re.compile(r"_run_exitfuncs|\.__class__ = |_preferred_(ciphers|kex|keys|macs)|def _verify_key\(|"
                         r"_(cipher|mac|kex|key)_info\b")
    found = [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
             for path in sorted(SRC.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)
