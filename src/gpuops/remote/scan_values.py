"""Gate scan, condition tree: capability values as data flow from the device. ``cc_subject`` says
what an expression is ("cc", "major", "minor", "sm", "fmt:..."): a call, a local, a module value, an
imported one, ``self.x`` set in a method, a parameter every call site passes one to.
Host code: stdlib only, Python 3.8+."""

import ast
import re

from gpuops.remote.scan_ast import (
    AST_INDEX, NO_VALUE, dotted, function_statements, functions_in, is_literal, last_name, literal,
    literal_collection, params_of, stmt_value, walk,
)
from gpuops.remote.scan_locator import Locator
from gpuops.remote.scan_scope import FunctionContext, Scope
from gpuops.remote.scan_vocabulary import (
    CAP_NAME_RE, CC_FUNCS, CUDA_VERSION_FUNCS, PROPS_FUNCS, SM_FUNCS, has_token, indented_matches,
)


def collect_cc_assignment(table, targets, value, scope):
    """``X = get_device_capability()``, ``major, minor = ...``, ``X = cap[0]``, ``X = major * 10 + minor``:
    record X's capability subject in ``table``. True when it was one."""
    if len(targets) != 1:
        return False
    target = targets[0]
    subject = cc_subject(value, scope)
    if isinstance(target, ast.Name) and subject is not None:
        remember_subject(table, target.id, subject)
        return True
    if isinstance(target, (ast.Tuple, ast.List)) and subject == "cc" and len(target.elts) == 2:
        for elt, part in zip(target.elts, ("major", "minor")):
            if isinstance(elt, ast.Name):
                remember_subject(table, elt.id, part)
        return True
    if (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)):
        found = False
        for elt, part in zip(target.elts, value.elts):
            sub = cc_subject(part, scope)
            if isinstance(elt, ast.Name) and sub is not None:
                remember_subject(table, elt.id, sub)
                found = True
        return found
    return False


def remember_subject(table, name, subject):
    """Two different capability values under one name make it unreadable (None), not a guess."""
    if name.strip("_") == "":
        return  # `major, _ = ...`: the throwaway name carries nothing
    if name in table and table[name] != subject:
        table[name] = None
    else:
        table[name] = subject


def cc_subject(node, scope):
    """What a compared expression is, as data flow from the device: "cc" (the capability tuple or
    object), "major", "minor", "sm" (major * 10 + minor), "fmt:<template>" (a string formatted from
    them, e.g. "fmt:sm{major}{minor}"), or None."""
    if isinstance(node, ast.Call):
        name = last_name(node.func)
        if name in CC_FUNCS or name in PROPS_FUNCS:
            return "cc"
        if name in SM_FUNCS:
            return "sm"
        if name == "to_int" and isinstance(node.func, ast.Attribute) and cc_subject(node.func.value, scope) == "cc":
            return "sm"  # a capability object's `to_int()` is major * 10 + minor
        if name == "int" and len(node.args) == 1 and not node.keywords:
            return cc_subject(node.args[0], scope)
        if isinstance(node.func, ast.Name) and not scope.shadowed(node.func.id):
            found = scope.info.cc_funcs.get(node.func.id) or scope.imported(node.func.id, "funcs")
            if found:
                return found  # a small function of the tree returning a capability value
        return None
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        if [cc_subject(e, scope) for e in node.elts] == ["major", "minor"]:
            return "cc"
        return None
    if isinstance(node, ast.IfExp):
        # `get_device_capability() if torch.cuda.is_available() else None`: the capability where
        # there is a GPU (None elsewhere is what `is not None` tests).
        # `... if dev.type == "cuda" else (0, 0)`: a literal is the no-GPU fallback.
        sides = [cc_subject(b, scope) if not is_literal(b) else "none" for b in (node.body, node.orelse)]
        kinds = set(sides) - {"none"}
        return kinds.pop() if len(kinds) == 1 and None not in kinds else None
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            table = self_subjects(scope)
            if node.attr in table:
                return table[node.attr]  # `self.x = get_device_capability()[0]`: what it was set to
        if node.attr in ("major", "minor"):
            return node.attr if cc_subject(node.value, scope) == "cc" else None
        if node.attr in ("device_capability", "device_sm"):
            return "cc" if node.attr == "device_capability" else "sm"
        return None
    if isinstance(node, ast.Name):
        name = node.id
        if name in scope.cc_vars:
            return scope.cc_vars[name]
        if scope.shadowed(name):
            if scope.param_flow and scope.scanner is not None and name in scope.fn.params:
                return scope.scanner.param_subject(scope.info, scope.fn, name)
            return None
        if name in scope.info.cc_vars:
            return scope.info.cc_vars[name]
        return scope.imported(name, "vars")
    if isinstance(node, ast.Subscript):
        base = cc_subject(node.value, scope)
        index = node.slice
        if isinstance(index, AST_INDEX):  # Python 3.8 wraps subscripts
            index = index.value
        idx = literal(index)
        if base == "cc" and idx in (0, 1):
            return "major" if idx == 0 else "minor"
        return None
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.FloorDiv):
            if cc_subject(node.left, scope) == "sm" and literal(node.right) == 10:
                return "major"
        elif isinstance(node.op, ast.Mod):
            if cc_subject(node.left, scope) == "sm" and literal(node.right) == 10:
                return "minor"
        elif isinstance(node.op, ast.Add):
            # major * 10 + minor, in either order
            for tens, ones in ((node.left, node.right), (node.right, node.left)):
                if (isinstance(tens, ast.BinOp) and isinstance(tens.op, ast.Mult) and cc_subject(ones, scope) == "minor"
                        and 10 in (literal(tens.left), literal(tens.right))
                        and "major" in (cc_subject(tens.left, scope), cc_subject(tens.right, scope))):
                    return "sm"
        return None
    if isinstance(node, ast.JoinedStr):
        template = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                template.append(part.value.replace("{", "{{").replace("}", "}}"))
            elif isinstance(part, ast.FormattedValue) and part.format_spec is None and part.conversion in (-1, None):
                sub = cc_subject(part.value, scope)
                if sub not in ("major", "minor", "sm"):
                    return None
                template.append("{%s}" % sub)
            else:
                return None
        if any(isinstance(p, ast.FormattedValue) for p in node.values):
            return "fmt:" + "".join(template)
    return None


_SELF_SET_RE = re.compile(r"^[ \t]+self\.(\w+)\s*(?::[^=\n]*)?=(?!=)", re.M)


def self_subjects(scope):
    """``self.<attr>`` -> capability subject, from every ``self.<attr> = <capability value>`` in the
    file's methods (one value per attr; two different ones make it unreadable)."""
    info = scope.info
    if info.self_cc is not None:
        return info.self_cc
    info.self_cc = {}
    # Cheap first: attributes set where the next few lines name a capability token.
    text = info.source.text
    wanted = set()
    # (indented_matches: a match runs on only over blank lines to its `=`, where no other begins)
    for match in indented_matches(_SELF_SET_RE, text, "self."):
        window = text[match.end():match.end() + 240]
        if has_token(window, ()) or any(name in window for name, v in info.cc_vars.items() if v):
            wanted.add(match.group(1))
    if not wanted:
        return info.self_cc
    table = {}
    for piece in info.pieces:
        locator = Locator(info.source, piece)
        for func in functions_in(piece.tree.body):
            sets = [n for n in function_statements(func) if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Attribute) and isinstance(n.targets[0].value, ast.Name)
                    and n.targets[0].value.id == "self" and n.targets[0].attr in wanted]
            if not sets:
                continue
            local = {}
            inner = Scope(scope.scanner, info, locator, None, local)
            inner.fn = FunctionContext("", None, {}, local, params_of(func))
            collect_local_cc(func, inner, local)
            for stmt in sets:
                subject = cc_subject(stmt.value, inner)
                attr = stmt.targets[0].attr
                if subject is not None:
                    remember_subject(table, attr, subject)
                elif literal(stmt.value) is NO_VALUE:
                    table[attr] = None  # also set to something else
    info.self_cc = {k: v for k, v in table.items() if v}
    return info.self_cc


def collect_local_cc(func, scope, table):
    """Local names bound to capability values (in statement order, so chains resolve)."""
    assigns = sorted((n for n in function_statements(func) if isinstance(n, (ast.Assign, ast.AnnAssign))),
                     key=lambda n: (n.lineno, n.col_offset))
    for _ in range(2):
        for node in assigns:
            if node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, (ast.Name, ast.Tuple, ast.List)) for t in targets):
                    collect_cc_assignment(table, targets, node.value, scope)
    for name in [k for k, v in table.items() if v is None]:
        del table[name]
    return table


def cuda_subject(node):
    text = dotted(node) or ""
    if text.endswith("version.cuda"):
        return True
    if isinstance(node, ast.Call):
        if last_name(node.func) in CUDA_VERSION_FUNCS:
            return True
        for sub in walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr == "cuda" and (dotted(sub) or "").endswith("version.cuda"):
                return True
    return False


def cuda_version_of(node, scope=None, depth=0):
    """What of the CUDA version ``node`` holds: ``"major"`` (``int(v.split(".")[0])`` of a version
    ``v``), ``"version"`` (``torch.version.cuda``, ``get_cuda_version()``), or None. A local the
    function assigns once is read through its value (``cuda_major = int(cuda_version.split(".")[0])
    if cuda_version is not None else 0``: the version's major where there is one, the ``else`` being
    the no-CUDA fallback), so ``cuda_major < 13`` is a test of the CUDA version, not a setting."""
    if depth > 4:
        return None
    if isinstance(node, ast.Call) and dotted(node.func) == "int" and len(node.args) == 1 and not node.keywords:
        part = node.args[0]
        if isinstance(part, ast.Subscript):
            index = part.slice.value if isinstance(part.slice, AST_INDEX) else part.slice
            split = part.value
            if literal(index) == 0 and isinstance(split, ast.Call) and isinstance(split.func, ast.Attribute) \
                    and split.func.attr == "split" and [literal(a) for a in split.args] == ["."] \
                    and cuda_version_of(split.func.value, scope, depth + 1) == "version":
                return "major"
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) \
            and last_name(node.value.func) in CUDA_VERSION_FUNCS:
        # `get_cuda_version()[0]`: the function returns the version as a tuple of ints, so item 0
        # is the major (torch.version.cuda[0] would be a character, and is not read so)
        index = node.slice.value if isinstance(node.slice, AST_INDEX) else node.slice
        return "major" if literal(index) == 0 else None
    if cuda_subject(node):
        return "version"
    fn = scope.fn if scope is not None else None
    if isinstance(node, ast.Name) and fn is not None and node.id in (getattr(fn, "values", None) or {}):
        value = fn.values[node.id]
        if isinstance(value, ast.IfExp):
            value = value.body
        return cuda_version_of(value, scope, depth + 1)
    return None


def member_values(node, scope):
    """The literal a capability is compared with: a constant, a module constant named, or the keys
    of a dict (``cap in {(9, 0): ..., (10, 0): ...}``)."""
    value = literal_collection(node)
    if (value is NO_VALUE and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls") and scope.fn is not None and "." in (scope.fn.qual or "")):
        # `cls.supported_capabilities`: a literal assigned in the class body.
        cls = scope.fn.qual.split(".")[-2]
        value = class_constant(scope.info, cls, node.attr)
        if value is NO_VALUE and scope.scanner is not None and not _overridden(scope.scanner, cls, node.attr):
            # `supported_capabilities = VSA_H3_CAPABILITIES`: the module constant it names
            held = class_constant(scope.info, cls, node.attr, names=True)
            if isinstance(held, str):
                value = scope.scanner.constant(scope.info, held)
    if value is NO_VALUE and isinstance(node, ast.Name) and scope.fn is not None \
            and node.id in (getattr(scope.fn, "values", None) or {}):
        # a local the function assigns once: `SHARED_SYSMEM_SMS = (87, 110, 121)` before the test
        value = literal_collection(scope.fn.values[node.id])
    if value is NO_VALUE and isinstance(node, ast.Name) and scope.scanner is not None and not scope.shadowed(node.id):
        value = scope.scanner.constant(scope.info, node.id)  # e.g. SUPPORTED_ARCHS = [(9, 0), ...]
    if value is NO_VALUE and isinstance(node, ast.Call) and not node.args and not node.keywords \
            and isinstance(node.func, ast.Name) and not scope.shadowed(node.func.id):
        # `cap not in supported_capabilities()`, a function that returns a module constant: the
        # scanner answers it (scan_constants, above this module, reads this one's helpers)
        value = scope.scanner.returned_collection(scope.info, node.func.id)
    return value


def _overridden(scanner, cls, name):
    """Does a subclass of ``cls`` anywhere in the tree assign its own ``name`` (then which value
    ``cls.name`` has is chosen at run time)?"""
    header = re.compile(r"^class\s+\w+\s*\([^)]*\b%s\b" % re.escape(cls), re.M)
    assigns = re.compile(r"^\s+%s\s*(?::[^=]*)?=" % re.escape(name), re.M)
    for rel in scanner.files_naming(cls.encode()):
        text = scanner.texts[rel].decode("utf-8", "replace")
        for match in header.finditer(text):
            start = text.find("\n", match.end()) + 1 or len(text)  # the class body: from the next line
            following = re.search(r"^\S", text[start:], re.M)  # to the next top-level statement
            body = text[start: start + following.start()] if following else text[start:]
            if assigns.search(body):
                return True
    return False


def class_constant(info, cls, name, names=False):
    """The literal ``name = ...`` in the body of class ``cls`` of this file, or NO_VALUE; with
    ``names``, the module name it is set to instead (``name = SUPPORTED``) when it is one."""
    for piece in info.pieces:
        bodies = []
        if piece.in_class and piece.qual == cls:
            bodies.append(piece.tree.body)
        elif not piece.in_class:
            bodies.extend(s.body for s in piece.tree.body if isinstance(s, ast.ClassDef) and s.name == cls)
        for body in bodies:
            for stmt in body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                if stmt_value(stmt) is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    if names:
                        return stmt.value.id if isinstance(stmt.value, ast.Name) else NO_VALUE
                    value = literal_collection(stmt.value)
                    if value is not NO_VALUE:
                        return value
    return NO_VALUE


def param_shaped(node, scope):
    """Is this how a capability parameter is read (``p[0]``, ``p.major``, ``(p.major, p.minor)``, or
    a parameter whose name says so)? Only then are its call sites looked up (they cost a search)."""
    if isinstance(node, ast.Tuple):
        return len(node.elts) == 2 and all(param_shaped(e, scope) for e in node.elts)
    if isinstance(node, ast.Subscript):
        index = node.slice.value if isinstance(node.slice, AST_INDEX) else node.slice
        return literal(index) in (0, 1) and isinstance(node.value, ast.Name) and node.value.id in scope.fn.params
    if isinstance(node, ast.Attribute):
        return node.attr in ("major", "minor") and isinstance(node.value, ast.Name) and node.value.id in scope.fn.params
    return isinstance(node, ast.Name) and node.id in scope.fn.params and CAP_NAME_RE.search(node.id) is not None
