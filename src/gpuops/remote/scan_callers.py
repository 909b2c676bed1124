"""Gate scan: who calls a function that holds gates, and under which enclosing conditions, so that
gpuops can tell a gate whose every caller is itself closed on the host's GPU (``if
is_sm100_supported(): fused_sm100_kernel(...)``) from one the GPU reaches. Host code: stdlib only,
Python 3.8+.

A function's call sites are every reference to its name in the tree (found by text, then parsed).
The answer is None (callers not known: the gate is judged on its own) when any reference is not a
plain call (passed as a value, stored in a table, named in a string for ``getattr``), when there
is no call at all (an entry point, a registered hook), or when too many files name it."""

import ast
import re

from gpuops.remote.scan_ast import child_nodes, walk
from gpuops.remote.scan_locator import Locator

# Only functions named for a GPU generation are looked up (``forward_sm100``, ``_hopper_kernel``):
# the case this is for (a function whose callers test for that GPU first), and few enough that the
# search of every file for the name costs little.
GPU_NAMED_RE = re.compile(r"(^|_)sm_?\d{2,3}[a-z]?($|_)|hopper|blackwell|ampere", re.I)
# More files than this name the function, or more call sites than this: too common a name to
# prove anything about (and too much to ship).
_MAX_FILES = 40
# How many callers up a site's own callers are followed (a kernel, its GPU-named wrapper, a dispatcher).
_MAX_DEPTH = 1
_MAX_SITES = 12
_TEXT_MAX = 200


def call_sites(scanner, name, own_rel, own_qual, depth=0):
    """[{"file", "line", "function", "within"}] for every call of ``name`` in the tree (``within``:
    the caller's enclosing if-tests, an ``else`` as ``not (test)``, as the walker writes them), or
    None. A call from inside the function itself (recursion) is left out. A ``return name`` (a
    dispatcher handing the function to its caller, ``if cap == (9, 0): return forward_sm90``) is a
    site too, inside its tests. A site in a function itself named for a GPU generation, with no
    test around it, carries that function's own ``callers`` (one level: ``forward_sm90`` calls
    ``kernel_sm90``, and a dispatcher returns ``forward_sm90`` only to sm90)."""
    cache = scanner.__dict__.setdefault("_call_sites", {})
    key = (name, own_rel, own_qual, depth)
    if key in cache:
        return cache[key]
    cache[key] = None
    if len(name) <= 3 or name.startswith("__") or not GPU_NAMED_RE.search(name):
        return None
    holders = scanner.files_naming(name.encode())
    if len(holders) > _MAX_FILES:
        return None
    sites = []
    for rel in holders:
        try:
            info = scanner.site_info(rel)
            pieces = scanner.statements_naming(info, name) if info is not None else None
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        if pieces is None:
            return None
        for piece in pieces:
            found = _sites_in(piece.tree.body, name, Locator(info.source, piece), piece, piece.qual, [], rel, own_rel,
                              own_qual)
            if found is None:
                return None
            sites.extend(found)
            if len(sites) > _MAX_SITES:
                return None
    if not sites:
        return None
    if depth < _MAX_DEPTH:
        for site in sites:
            caller = site["function"].split(".")[-1]
            if not site["within"] and site["function"] != "<module>" and GPU_NAMED_RE.search(caller):
                outer = call_sites(scanner, caller, site["file"], site["function"], depth + 1)
                if outer:
                    site["callers"] = outer
    cache[key] = sites
    return sites


def _sites_in(body, name, locator, piece, qual, within, rel, own_rel, own_qual):
    out = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = (qual + "." if qual else "") + stmt.name
            for deco in stmt.decorator_list:
                if _names(deco, name):
                    return None  # used as a decorator: called by what it decorates
            if isinstance(stmt, ast.ClassDef) and _names_any(stmt.bases + [k.value for k in stmt.keywords], name):
                return None
            found = _sites_in(stmt.body, name, locator, piece, inner, [], rel, own_rel, own_qual)
            if found is None:
                return None
            out.extend(found)
            continue
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if any(a.name.split(".")[-1] == name and a.asname not in (None, name) for a in stmt.names):
                return None  # imported under another name: its calls are not found by this one
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id == "__all__":
            continue  # the module's export list names it for `import *`: no call
        if isinstance(stmt, ast.Return) and stmt.value is not None and _is_name(stmt.value, name):
            if (rel, qual) != (own_rel, own_qual):
                out.append({"file": rel, "line": stmt.lineno + piece.line0, "function": qual or "<module>",
                            "within": list(within)})
            continue  # handed to the caller, which calls it: the tests around the return decide who gets it
        if isinstance(stmt, (ast.If, ast.While)):
            found = _calls(stmt.test, name, piece, qual, within, rel, own_rel, own_qual)
            if found is None:
                return None
            out.extend(found)
            test = locator.text(stmt.test, _TEXT_MAX)  # as the walker writes ``within``
            for part, more in ((stmt.body, [test]), (stmt.orelse, ["not (%s)" % test])):
                found = _sites_in(part, name, locator, piece, qual, within + more, rel, own_rel, own_qual)
                if found is None:
                    return None
                out.extend(found)
            continue
        for child in child_nodes(stmt):
            if isinstance(child, (ast.stmt, ast.excepthandler)):
                continue
            found = _calls(child, name, piece, qual, within, rel, own_rel, own_qual)
            if found is None:
                return None
            out.extend(found)
        blocks = [getattr(stmt, f, None) for f in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in getattr(stmt, "handlers", None) or ()]
        for block in blocks:
            if isinstance(block, list) and block:
                found = _sites_in(block, name, locator, piece, qual, within, rel, own_rel, own_qual)
                if found is None:
                    return None
                out.extend(found)
    return out


def _calls(expr, name, piece, qual, within, rel, own_rel, own_qual):
    """The calls of ``name`` in one expression, or None when it names ``name`` otherwise."""
    called = set()
    out = []
    for node in walk(expr):
        if isinstance(node, ast.Call) and _is_name(node.func, name):
            called.add(id(node.func))
            if (rel, qual) != (own_rel, own_qual):
                out.append({"file": rel, "line": node.lineno + piece.line0, "function": qual or "<module>",
                            "within": list(within)})
    for node in walk(expr):
        if _is_name(node, name) and id(node) not in called:
            return None  # a reference that is not a call: it may be called from anywhere
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and name in node.value:
            return None  # named in a string: getattr(obj, "forward_sm100"), a registry key
    return out


def _is_name(node, name):
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _names(node, name):
    return any(_is_name(n, name) for n in walk(node))


def _names_any(nodes, name):
    return any(_names(n, name) for n in nodes)

