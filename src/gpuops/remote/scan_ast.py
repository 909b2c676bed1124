"""Gate scan: small AST helpers shared by every stage (dotted names, literals, statement walks).
Host code: stdlib only, Python 3.8+ (3.8 wraps subscripts in ``ast.Index``: ``AST_INDEX``)."""

import ast
import re


def dotted(node):
    """``get_exec().comm.x`` -> "get_exec().comm.x", ``f(view)`` -> "f(...)", ``a.b[0]`` -> "a.b[0]";
    None when the node is not a plain reference."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else base + "." + node.attr
    if isinstance(node, ast.Call):
        base = dotted(node.func)
        if base is None:
            return None
        return base + ("()" if not node.args and not node.keywords else "(...)")
    if isinstance(node, ast.Subscript):
        base = dotted(node.value)
        index = node.slice.value if isinstance(node.slice, AST_INDEX) else node.slice
        key = literal(index)
        if base is None or key is NO_VALUE or not isinstance(key, (int, str)):
            return None
        return "%s[%r]" % (base, key)
    return None


def last_name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return last_name(node.func)
    return None


# Never a literal for ``ast.literal_eval`` (it raises on them): answered without calling it.
_NOT_LITERAL = (ast.Name, ast.Attribute, ast.Subscript, ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda,
                ast.JoinedStr)


def literal(node):
    if isinstance(node, ast.Constant):
        return jsonable(node.value)  # what literal_eval returns for one, without its nested closures
    if isinstance(node, _NOT_LITERAL):
        return NO_VALUE
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.Call) and last_name(node.func) in ("frozenset", "set", "tuple", "list") and len(node.args) == 1:
            return literal(node.args[0])
        return NO_VALUE
    return jsonable(value)


NO_VALUE = object()


def is_literal(node):
    """``literal(node) is not NO_VALUE``, kept on the node: a large literal (a table of hundreds of
    entries as one side of ``A if test else B``) is asked again by each reading of its function."""
    known = node.__dict__.get("_gpuops_literal")
    if known is None:
        known = node._gpuops_literal = literal(node) is not NO_VALUE
    return known

AST_INDEX = getattr(ast, "Index", ())


def jsonable(value):
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def string_of(node):
    """The text of a message argument: constants kept, formatted parts shown as {...}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = string_of(node.left)
        right = string_of(node.right) if isinstance(node.op, ast.Add) else ""
        if left is not None:
            return left + (right or "")
    return None


CMP_OPS = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}


def version_tuple(value):
    if isinstance(value, str):
        parts = re.findall(r"\d+", value)
        return [int(p) for p in parts[:2]] if parts else None
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return value[:2]
    return None


def literal_collection(node):
    if isinstance(node, ast.Dict):
        keys = [literal(k) for k in node.keys if k is not None]
        return NO_VALUE if len(keys) != len(node.keys) or NO_VALUE in keys else keys
    return literal(node)


def literal_return(stmt):
    """True/False for `return True`/`return False|None|`; None for anything else."""
    if stmt.value is None:
        return False
    value = literal(stmt.value)
    if value is True:
        return True
    if value is False or value is None:
        return False
    return None


def boolish(node):
    return isinstance(node, (ast.BoolOp, ast.Compare, ast.Name, ast.Attribute, ast.Call)) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))


def flip(op):
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)


def stmt_value(stmt):
    return getattr(stmt, "value", None)


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")  # where statements nest (cases: match)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _statement_walk(body, into_scopes):
    """Every statement under ``body`` (match cases included), as a list; nested functions and
    classes are entered only when ``into_scopes``."""
    stack = list(body)
    pop, extend = stack.pop, stack.extend
    out = []
    while stack:
        node = pop()
        out.append(node)
        if not into_scopes and isinstance(node, _SCOPES):
            continue
        for name in _BLOCKS:
            block = getattr(node, name, None)
            if block:
                extend(block)
    return out


def functions_in(body):
    """Every function under these statements, nested ones and methods included."""
    return (node for node in _statement_walk(body, True)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def statements(body):
    """Every statement under ``body`` (not expressions), without entering nested functions."""
    return _statement_walk(body, False)


_AST = ast.AST
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def walk(node):
    """Every node under ``node``, itself included, as a list in ``ast.walk``'s order (breadth first,
    children in field order). The scan walks every function several times, and ``ast.walk``'s two
    nested generators per node (``iter_child_nodes``, ``iter_fields``) made it the scan's largest
    cost; reading ``_fields`` here is 2-3 times faster, in the same order."""
    todo = [node]
    append = todo.append
    for current in todo:  # the list grows while it is read: a queue without a deque
        # child_nodes' loop, inlined on purpose: a call per node made the walk 15-40% slower
        # (0.7-0.9 -> 1.0 ms over 0.5.23's server_args.py), and the scan walks millions of nodes.
        for name in current._fields:
            value = getattr(current, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, _AST):
                        append(item)
            elif isinstance(value, _AST):
                append(value)
    return todo


def child_nodes(node):
    """``ast.iter_child_nodes(node)`` as a list, in its order (fields read directly)."""
    out = []
    append = out.append
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, list):
            for item in value:
                if isinstance(item, _AST):
                    append(item)
        elif isinstance(value, _AST):
            append(value)
    return out


def function_statements(func):
    """``statements(func.body)``, kept on the function's node: the walker, its local values, its
    capability locals and the file's deferred imports each read a function's statements (a body is
    never changed once parsed). A shared list: read it, never change it."""
    found = func.__dict__.get("_gpuops_statements")
    if found is None:
        found = func._gpuops_statements = _statement_walk(func.body, False)
    return found


def walk_no_nested(body):
    """Every node under ``body`` except inside nested functions and classes (depth first, the
    last statement first), as a list."""
    stack = list(body)
    pop, push = stack.pop, stack.append
    out = []
    while stack:
        node = pop()
        out.append(node)
        if isinstance(node, _NESTED):
            continue
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, _AST):
                        push(item)
            elif isinstance(value, _AST):
                push(value)
    return out


def params_of(func):
    args = func.args
    names = [a.arg for a in getattr(args, "posonlyargs", [])] + [a.arg for a in args.args]
    names += [a.arg for a in args.kwonlyargs]
    for extra in (args.vararg, args.kwarg):
        if extra is not None:
            names.append(extra.arg)
    return names


def docstring_line(func):
    doc = ast.get_docstring(func, clean=True) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
    return doc.strip().splitlines()[0][:200] if doc and doc.strip() else None
