"""Python source parsed into ``ast`` trees, one thread at a time.

CPython 3.11 keeps the counter that checks the depth of the tree it builds for ``ast.parse`` in the
interpreter's AST state, not in the call (the SystemError of cpython gh-106905; reproduced on
3.11.7 by tests/unit/test_python_ast.py, which passes wherever the lock holds). A thread switch in the
middle of building a tree (a garbage collection that runs Python code, a finaliser, a callback)
lets another thread's parse move that counter, and the first one fails with ``SystemError: AST
constructor recursion depth mismatch``. gpuops parses SGLang's sources per host in threads (the
gate scan, the fusion patch's plan): a real CI run lost a host's apply to it. So every parse in the
client goes through here, under one lock; the parses are short (milliseconds), and the hosts'
threads spend their time waiting on the network, not here.

(``remote/`` runs on the host in one thread and keeps to the standard library; it parses directly.)
"""

from __future__ import annotations

import ast
import threading
from typing import Any, Literal

_PARSING = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: Literal["exec", "eval"] = "exec") -> ast.AST:
    """``ast.parse``, one thread at a time; raises what it raises (SyntaxError, ValueError)."""
    with _PARSING:
        return ast.parse(source, filename=filename, mode=mode)


def parse_module(source: str, filename: str = "<unknown>") -> ast.Module:
    tree = parse(source, filename)
    assert isinstance(tree, ast.Module)
    return tree


def parse_expression(source: str) -> ast.expr:
    """The expression ``source`` holds (``mode="eval"``), its body."""
    tree = parse(source, mode="eval")
    assert isinstance(tree, ast.Expression)
    return tree.body


def literal(source: str) -> Any:
    """``ast.literal_eval`` of a string (which parses it: the same lock)."""
    return ast.literal_eval(parse_expression(source.lstrip(" \t")))
