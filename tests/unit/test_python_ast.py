"""Python source is parsed one thread at a time (gpuops.python_ast).

CPython 3.11 keeps the AST constructor's depth counter in the interpreter (cpython gh-106905): two
threads building trees at once make one fail with ``SystemError: AST constructor recursion depth
mismatch``. CI lost the workstation's fusion apply in test_mixed_fleet to it. The race is made here
on purpose: a garbage collection that runs Python code (a ``gc.callbacks`` entry that sleeps)
switches threads in the middle of building a tree; without the lock, 3.11.7 fails within ~0.15 s.
"""

from __future__ import annotations

import ast
import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops import python_ast
from labtools import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "gpuops"


@pytest.fixture
def collections_switch_threads() -> Iterator[None]:
    def yield_the_gil(phase: str, info: dict) -> None:
        time.sleep(0)

    threshold = gc.get_threshold()
    gc.callbacks.append(yield_the_gil)
    gc.set_threshold(5)
    try:
        yield
    finally:
        gc.callbacks.remove(yield_the_gil)
        gc.set_threshold(*threshold)


def test_two_threads_parsing_different_sources_never_see_the_depth_mismatch(collections_switch_threads) -> None:
    errors: list[str] = []
    parsed = [0, 0]
    stop = time.monotonic() + 1.0

    def parse_until_stopped(index: int, depth: int) -> None:
        source = ("x = " + "[" * depth + "1" + "]" * depth + "\n") * 2
        while time.monotonic() < stop and not errors:
            try:
                python_ast.parse(source)
            except SystemError as exc:
                errors.append(str(exc))
            parsed[index] += 1

    threads = [threading.Thread(target=parse_until_stopped, args=(i, depth)) for i, depth in enumerate((3, 20))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert min(parsed) > 100, parsed  # both threads really parsed, side by side


def test_the_helpers_return_what_ast_returns() -> None:
    assert isinstance(python_ast.parse_module("x = 1\n"), ast.Module)
    assert ast.unparse(python_ast.parse_expression("(a  and b)")) == "a and b"
    assert python_ast.literal(" {'a': [1, 2.5, None]}") == {"a": [1, 2.5, None]}
    with pytest.raises(ValueError):
        python_ast.literal("f(1)")
    with pytest.raises(SyntaxError):
        python_ast.parse("def (")


# (module, function called) pairs allowed outside python_ast.py, each with why.
ALLOWED = {
    ("gates/in_effect.py", "literal_eval"),  # given a node already parsed, it parses nothing
    ("facts/software_remote.py", "parse"),  # runs on the host, in one thread, standard library alone
}


def parses_outside_the_lock(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast"
                and node.func.attr in ("parse", "literal_eval")):
            where = str(path.relative_to(PACKAGE))
            if (where, node.func.attr) not in ALLOWED:
                found.append(f"{where}:{node.lineno}: ast.{node.func.attr}")
    return found


def test_the_client_parses_only_through_python_ast() -> None:
    # remote/ runs on the host, in one thread, with the standard library alone.
    modules = [p for p in sorted(PACKAGE.rglob("*.py"))
               if p.name != "python_ast.py" and "remote" not in p.relative_to(PACKAGE).parts]
    assert len(modules) > 100
    found = [line for path in modules for line in parses_outside_the_lock(path)]
    assert not found, "parse through gpuops.python_ast (one thread at a time): " + "; ".join(found)
