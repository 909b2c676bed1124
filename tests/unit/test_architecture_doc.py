"""docs/ARCHITECTURE.md is held to the code: every ``path.py::name`` it cites resolves to a
top-level definition (or ``Class.attribute``) of that module, and every ``.py`` file it names exists
(a bare file name somewhere under src/gpuops, a path under src/gpuops or the checkout)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "gpuops"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
CITED = re.compile(r"`([A-Za-z0-9_./-]+\.py)(?:::([A-Za-z_][A-Za-z0-9_.]*))?`")


def _module_file(cited: str) -> Path | None:
    for base in (SRC, ROOT):
        if (base / cited).is_file():
            return base / cited
    if "/" not in cited:
        found = sorted(SRC.rglob(cited))
        return found[0] if found else None
    return None


def _ours(cited: str) -> bool:
    """A path into gpuops' tree: a bare file name, or one whose first part is a folder of the
    package or of the checkout."""
    first = cited.split("/")[0]
    return "/" not in cited or (SRC / first).is_dir() or (ROOT / first).is_dir()


def _defines(tree: ast.Module, dotted: str) -> bool:
    body: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        names: dict[str, ast.stmt] = {}
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, ast.Assign):
                names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names[node.target.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        found = names.get(part)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def citations(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in CITED.finditer(text) if m.group(1) != ".py"]


def test_every_module_and_name_the_architecture_doc_cites_exists() -> None:
    problems = []
    for cited, name in citations(DOC.read_text(encoding="utf-8")):
        if not _ours(cited):
            continue  # another project's file (``flashinfer/jit/comm.py``): cited as what it is there
        path = _module_file(cited)
        if path is None:
            problems.append(f"{cited}: no such file")
        elif name is not None and not _defines(ast.parse(path.read_text(encoding="utf-8")), name):
            problems.append(f"{cited}::{name}: {path.relative_to(ROOT)} defines no {name}")
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_stale_name_and_a_missing_file() -> None:
    assert citations("`gates/patch.py::_gen` and `facts/gpu.py`") == [("gates/patch.py", "_gen"), ("facts/gpu.py", None)]
    tree = ast.parse((SRC / "gates" / "patch.py").read_text(encoding="utf-8"))
    assert not _defines(tree, "_gen")  # the name ARCHITECTURE.md once cited
    assert _defines(ast.parse((SRC / "gates" / "catalog.py").read_text(encoding="utf-8")), "KernelNeed")
    assert _module_file("apply/stream.py") is None and _module_file("transport/stream.py") is not None
    assert _ours("apply/stream.py") and _ours("gather.py") and not _ours("flashinfer/jit/comm.py")
