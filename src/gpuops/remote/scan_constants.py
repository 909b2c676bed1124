"""Gate scan, condition tree: a capability compared with a value held in a constant method or a
parameter. ``capability < self.get_min_capability()`` where every definition of
``get_min_capability`` in the tree (the class's, its subclasses', any class's: which one runs is
chosen at run time) returns a literal, and ``capability >= min_capability`` where every call site in
the tree passes a literal, a module constant or such a method: the comparison is with one of those
values (``Choices``); gpuops decides it where they all agree for the GPU, and only then.
Host code: stdlib only, Python 3.8+."""

import ast
import re

from gpuops.remote.scan_ast import (
    NO_VALUE, function_statements, functions_in, last_name, literal, literal_collection, walk, walk_no_nested,
)
from gpuops.remote.scan_discovery import module_files
from gpuops.remote.scan_fileinfo import import_in_text
from gpuops.remote.scan_scope import Scope

# More files than this define or call the name: too common a name to prove anything about.
_MAX_HOLDERS = 80
# What holds a call site of its own (param_values).
_CALLERS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


class Choices(list):
    """The values a comparison's other side can have (one per definition or call site)."""


def local_values(func):
    """{name: value node} of the names ``func`` assigns exactly once (``x = Cls.get_min_capability()``)."""
    counts, values = {}, {}
    binding = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)
    # Bindings are statements, and statements never sit inside expressions (a lambda's body is one
    # expression): the statements are the nodes to read, not every node of the function.
    for node in function_statements(func):
        if isinstance(node, binding):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name):  # the usual target: no walk needed
                    counts[target.id] = counts.get(target.id, 0) + 1
                    continue
                for sub in walk(target) if target is not None else ():
                    if isinstance(sub, ast.Name):
                        counts[sub.id] = counts.get(sub.id, 0) + 1
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                values[node.targets[0].id] = node.value
    return {name: value for name, value in values.items() if counts.get(name) == 1}


def constant_choices(node, scope, depth=0):
    """The values ``node`` can have, as ``Choices``, or NO_VALUE."""
    if depth > 3 or scope.scanner is None:
        return NO_VALUE
    value = _plain(node)
    if value is not NO_VALUE:
        return Choices([value])
    if isinstance(node, ast.Call) and not node.args and not node.keywords and last_name(node.func):
        return method_values(scope.scanner, last_name(node.func))
    if isinstance(node, ast.Name):
        fn = scope.fn
        if fn is not None and node.id in getattr(fn, "values", {}):
            return constant_choices(fn.values[node.id], scope, depth + 1)
        if fn is not None and node.id in fn.params and fn.qual:
            return param_values(scope.scanner, fn, node.id)
        if node.id in scope.info.aliases:
            value = _plain(scope.info.aliases[node.id][0])
            if value is not NO_VALUE:
                return Choices([value])
        constant = scope.scanner.constant(scope.info, node.id)  # `_MIN_SM = (10, 0)`, here or imported
        if isinstance(constant, list) and len(constant) == 2 and all(isinstance(v, int) for v in constant):
            return Choices([constant])
    return NO_VALUE


def _plain(node):
    value = literal(node)
    if isinstance(value, bool) or value is None:
        return NO_VALUE
    if isinstance(value, int):
        return value
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return list(value)
    return NO_VALUE


def method_values(scanner, name):
    """The literal every definition of the method or function ``name`` in the tree returns
    can return (``_returned_constants``; a base class's ``raise NotImplementedError`` adds
    nothing), or NO_VALUE when one returns anything else."""
    cache = scanner.__dict__.setdefault("_method_values", {})
    if name in cache:
        return cache[name]
    cache[name] = NO_VALUE
    holders = scanner.files_naming(("def " + name + "(").encode())
    found = Choices()
    if not holders or len(holders) > _MAX_HOLDERS:
        return NO_VALUE
    for rel in holders:
        info, pieces = _statements_naming(scanner, rel, name)
        if pieces is None:
            return NO_VALUE
        for piece in pieces:
            # the functions by a walk of statements, not of every node (the order differs from a
            # whole walk's, and does not matter: every definition must return constants, and the
            # values are sorted where they are read, compare_atoms)
            for func in functions_in(piece.tree.body):
                if func.name == name:
                    if _abstract(func.body):
                        continue  # a base class's `raise NotImplementedError`: it returns nothing
                    values = _returned_constants(func)
                    if values is NO_VALUE:
                        return NO_VALUE
                    found.extend(values)
    if not found:
        return NO_VALUE
    cache[name] = found
    return found


def _abstract(body):
    """Only a docstring, ``pass``/``...`` or a raise (or ``return NotImplementedError``, written
    by mistake for a raise): a method that returns nothing of its own."""
    rest = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            and not isinstance(s, ast.Pass)]
    return all(isinstance(s, ast.Raise) or (isinstance(s, ast.Return) and s.value is not None and
                                            (last_name(s.value) or "").startswith("NotImplemented")) for s in rest)


_OTHER_PLATFORM_RE = re.compile(r"^_?is_(npu|musa|hip|xpu|cpu|mps|hpu)$")


def _on_cuda(body):
    """``body`` without the branches of ``if <another platform>:`` (their else kept)."""
    out = []
    for stmt in body:
        if isinstance(stmt, ast.If) and _OTHER_PLATFORM_RE.match(last_name(stmt.test) or ""):
            out.extend(_on_cuda(stmt.orelse))
        else:
            out.append(stmt)
    return out


def _returned_constants(func):
    """Every value ``func`` can return, when each of its returns is a literal, a conditional
    expression of literals or a call of a method of the same name (``return
    Fp8Config.get_min_capability()``, whose values are already among those collected), as a
    list; else NO_VALUE. What another platform's branch returns (``if is_npu(): return 0``) is
    left out: it is not what a CUDA host gets."""
    values = []
    returns = [n for n in walk_no_nested(_on_cuda(func.body)) if isinstance(n, ast.Return)]
    if not returns:
        return NO_VALUE
    for ret in returns:
        node = ret.value
        options = [node.body, node.orelse] if isinstance(node, ast.IfExp) else [node]
        for option in options:
            if isinstance(option, ast.Call) and not option.args and last_name(option.func) == func.name:
                continue
            value = _plain(option) if option is not None else NO_VALUE
            if value is NO_VALUE:
                return NO_VALUE
            values.append(value)
    return values


def param_values(scanner, fn, param):
    """The values every call of ``fn`` in the tree passes for ``param`` (a literal, a module
    constant of the caller, a constant method), or NO_VALUE. A call that forwards the parameter
    of an override of the same name (``super().f(capability)``) adds nothing of its own."""
    name = fn.qual.split(".")[-1]
    cache = scanner.__dict__.setdefault("_param_values", {})
    key = (fn.qual, param)
    if key in cache:
        return cache[key]
    cache[key] = NO_VALUE
    if param not in fn.params or len(name) <= 3 or name.startswith("__"):
        return NO_VALUE
    position = fn.params.index(param) - (1 if fn.first_is_self else 0)
    holders = scanner.files_naming(name.encode())
    if len(holders) > _MAX_HOLDERS:
        # files_naming finds substrings: `_check` is in every `_check_cuda_device_version` and
        # `access_check`. Only the files that name it as a word count towards too common a name.
        word = re.compile(rb"(?<!\w)" + re.escape(name.encode()) + rb"\b")
        holders = [rel for rel in holders if word.search(scanner.texts[rel])]
    if len(holders) > _MAX_HOLDERS:
        return NO_VALUE
    found = Choices()
    for rel in holders:
        info, pieces = _statements_naming(scanner, rel, name)
        if pieces is None:
            return NO_VALUE
        for piece in pieces:
            # A lambda is a caller too (`is_hopper_with_cuda_12_3 = lambda: _check(9)`): its call is
            # not under any def, and walk_no_nested does not enter it from the statement around it.
            callers = [piece.tree] + [n for n in walk(piece.tree) if isinstance(n, _CALLERS)]
            for caller in callers:
                body = [caller.body] if isinstance(caller, ast.Lambda) else caller.body
                for call in (n for n in walk_no_nested(body) if isinstance(n, ast.Call) and last_name(n.func) == name):
                    arg = next((k.value for k in call.keywords if k.arg == param), None)
                    if arg is None and 0 <= position < len(call.args):
                        arg = call.args[position]
                    if arg is None:
                        return NO_VALUE  # its default, or a call gpuops cannot read
                    if isinstance(caller, ast.FunctionDef) and caller.name == name and isinstance(arg, ast.Name) \
                            and arg.id == param:
                        continue  # an override forwarding its own parameter
                    value = constant_choices(arg, Scope(scanner, info, None), 1)
                    if value is NO_VALUE:
                        return NO_VALUE
                    found.extend(value)
    if not found:
        return NO_VALUE
    cache[key] = found
    return found


def returned_collection(scanner, info, name, depth=0):
    """The literal collection the function ``name`` (defined in this module or imported from
    another) returns when its every return is one, written out or a module constant
    (``def supported_capabilities(): return SUPPORTED_CAPABILITIES``), or NO_VALUE."""
    if scanner is None or depth > 2:
        return NO_VALUE
    imported = info.imports.get(name) or import_in_text(info, name)
    if imported:
        module, original = imported
        for rel in module_files(module):
            if rel in scanner.texts:
                other, _ = _statements_naming(scanner, rel, original)
                if other is not None:
                    return returned_collection(scanner, other, original, depth + 1)
        return NO_VALUE
    try:
        pieces = scanner.statements_naming(info, name)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return NO_VALUE
    funcs = [n for piece in pieces if not piece.in_class for n in piece.tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if len(funcs) != 1:
        return NO_VALUE
    returns = [n for n in walk_no_nested(_on_cuda(funcs[0].body)) if isinstance(n, ast.Return)]
    values = []
    for ret in returns:
        if ret.value is None:
            return NO_VALUE
        value = literal_collection(ret.value)
        if value is NO_VALUE and isinstance(ret.value, ast.Name):
            value = scanner.constant(info, ret.value.id)
        if value is NO_VALUE or not isinstance(value, list):
            return NO_VALUE
        values.append(value)
    return values[0] if values and all(v == values[0] for v in values) else NO_VALUE


def _statements_naming(scanner, rel, name):
    """(site info, the statements of ``rel`` that name ``name``); pieces None where the file cannot be
    read or parsed, and the caller then cannot tell (NO_VALUE). The one reading both lookups share."""
    try:
        info = scanner.site_info(rel)
        return info, (scanner.statements_naming(info, name) if info is not None else None)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, None
