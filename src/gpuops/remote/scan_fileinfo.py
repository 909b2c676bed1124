"""Gate scan, stage 3: per-file knowledge. ``FileInfo`` holds what one file defines (imports,
module aliases, predicates and what they mean, platform tables, capability values and functions);
``load_info`` parses the file's pieces and collects them. Host code: stdlib only, Python 3.8+."""

import ast
import copy
import re

from gpuops.remote.scan_ast import (
    NO_VALUE, dotted, function_statements, functions_in, last_name, literal, literal_return, version_tuple, walk,
)
from gpuops.remote.scan_locator import Locator
from gpuops.remote.scan_pieces import Piece, split_pieces
from gpuops.remote.scan_scope import Scope
from gpuops.remote.scan_values import cc_subject, collect_cc_assignment
from gpuops.remote.scan_vocabulary import (
    CC_FUNCS, PLATFORM_NAME_RE, PRED_NAME_RE, SM_FUNCS, TOKENS, has_token, indented_matches,
)


class FileInfo(object):
    def __init__(self, source):
        self.source = source
        self.rel = source.rel
        self.pieces = []
        self.imports = {}          # local name -> (module, name)
        self.aliases = {}          # name -> (value node, locator)  module-level
        self.narrowed = set()      # (piece line0, line) of the module-level ifs that narrowed aliases
        self.predicates = {}       # name -> meaning dict (a class method's has "cls")
        self.helpers = set()       # functions used as partial(...) targets: predicate machinery
        self.platform_map = {}     # attr -> predicate name
        self.cc_vars = {}          # module-level name -> capability subject ("cc", "major", "sm", ...)
        self.cc_funcs = {}         # module-level function -> the capability subject it returns
        self.module_names = {}     # name bound by `import x` / `import x.y as z` -> module
        self.star_imports = []     # modules of `from m import *`
        self.self_cc = None        # `self.X` -> subject, from the file's methods (computed when walked)
        self.error = None
        self.whole = False         # parsed as one piece

    @property
    def module(self):
        parts = self.rel[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ["sglang"] + parts

    @property
    def top(self):
        """The file's top-level subpackage (srt, multimodal_gen, jit_kernel, ...): a name defined
        in both means what its own subpackage says."""
        return self.rel.split("/", 1)[0]


def parse_file(info, extra_names):
    """Fill ``info.pieces`` (a second call with more names adds only the pieces not parsed yet)."""
    if info.whole:
        return
    skip = {piece.line0 for piece in info.pieces}
    try:
        info.pieces = info.pieces + split_pieces(info.source, extra_names, skip)
        return
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    try:
        tree = ast.parse(info.source.text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None)
        info.error = "%s%s" % (type(exc).__name__, (" at line %s" % line) if line else "")
        info.pieces = []
        return
    info.pieces = [Piece(0, 0, tree, "", False)]
    info.whole = True


def load_info(info, extra_names):
    """Parse (more of) ``info`` and collect its definitions afresh."""
    parse_file(info, extra_names)
    if info.error:
        return
    info.imports, info.aliases, info.predicates, info.helpers, info.platform_map = {}, {}, {}, set(), {}
    info.narrowed = set()
    collect_definitions(info)


_IMPORT_RE = re.compile(r"^[ \t]*import[ \t]+([\w.]+)(?:[ \t]+as[ \t]+(\w+))?", re.M)


def import_lines(text):
    """``_IMPORT_RE.finditer(text)`` (``indented_matches``: a match ends on its own line)."""
    return indented_matches(_IMPORT_RE, text, "import")


def collect_definitions(info):
    # `import x.y as z` lines hold no token, so their pieces are not parsed: read them as text.
    for match in import_lines(info.source.text):
        if match.group(2):
            info.module_names[match.group(2)] = match.group(1)
        else:
            info.module_names[match.group(1).split(".")[0]] = match.group(1).split(".")[0]
    for piece in info.pieces:
        locator = Locator(info.source, piece)
        if piece.in_class:
            for stmt in piece.tree.body:
                collect_class_member(info, stmt, locator, piece.qual)
        else:
            for stmt in piece.tree.body:
                collect_module_statement(info, stmt, locator)
    narrow_aliases(info)
    # `from x import y` inside functions (deferred imports): the same names, where the module
    # does not bind them itself.
    for piece in info.pieces:
        for func in functions_in(piece.tree.body):
            for stmt in function_statements(func):
                if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                    for alias in stmt.names:
                        name = alias.asname or alias.name
                        if alias.name != "*" and name not in info.imports and name not in info.aliases:
                            info.imports[name] = (stmt.module, alias.name)


def module_scope(info, locator=None):
    return Scope(None, info, locator)


def collect_module_statement(info, stmt, locator, nested=False):
    """Definitions at module level. ``nested``: inside a module-level ``if``/``try`` (only imports
    and capability values are taken from there: a predicate or alias defined twice is ambiguous)."""
    if isinstance(stmt, ast.ImportFrom):
        module = resolve_relative(info, stmt.module, stmt.level)
        for alias in stmt.names:
            if alias.name != "*":
                info.imports[alias.asname or alias.name] = (module, alias.name)
            elif module not in info.star_imports:
                info.star_imports.append(module)
    elif isinstance(stmt, ast.Import):
        for alias in stmt.names:
            info.module_names[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or alias.name.split(".")[0]
    elif isinstance(stmt, (ast.If, ast.Try)) or (hasattr(ast, "TryStar") and isinstance(stmt, ast.TryStar)):
        blocks = [stmt.body, stmt.orelse, getattr(stmt, "finalbody", [])]
        blocks += [h.body for h in getattr(stmt, "handlers", [])]
        for block in blocks:
            for inner in block:
                collect_module_statement(info, inner, locator, nested=True)
    elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if stmt.value is None:
            return
        if collect_cc_assignment(info.cc_vars, targets, stmt.value, module_scope(info, locator)):
            return
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not names or nested:
            return
        meaning = meaning_from_partial(stmt.value, info)
        if meaning is not None:
            for name in names:
                info.predicates[name] = dict(meaning, line=stmt.lineno + locator.line0, source=locator.text(stmt.value, 200))
            return
        if isinstance(stmt.value, ast.Name) and PRED_NAME_RE.match(names[0]) and PRED_NAME_RE.match(stmt.value.id):
            for name in names:
                info.predicates[name] = {"same_as": stmt.value.id, "line": stmt.lineno + locator.line0, "source": stmt.value.id}
            return
        if isinstance(stmt.value, ast.Dict):
            mapping = {}
            for key, value in zip(stmt.value.keys, stmt.value.values):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Constant)
                        and isinstance(value.value, str) and PRED_NAME_RE.match(key.value)):
                    mapping[key.value] = value.value
            if mapping:
                info.platform_map.update(mapping)
                return
        for name in names:
            info.aliases[name] = (stmt.value, locator)
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and not nested:
        collect_function(info, stmt, locator, None)
    elif isinstance(stmt, ast.ClassDef) and not nested:
        for member in stmt.body:
            collect_class_member(info, member, locator, stmt.name)


def collect_class_member(info, stmt, locator, cls):
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and PRED_NAME_RE.match(stmt.name):
        existing = info.predicates.get(stmt.name)
        if existing is None or existing.get("cls"):
            collect_function(info, stmt, locator, cls)


def predicate_body(func):
    """The statements of a short function that may define a predicate or a capability value:
    docstring dropped; None when it is not short and plain (imports, assignments, early returns,
    one final return)."""
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(getattr(s, "value", None), ast.Constant))]
    last = body[-1] if body else None
    if (isinstance(last, ast.Try) and last.handlers and not last.orelse and not last.finalbody
            and all(h.body and isinstance(h.body[-1], ast.Return) and literal_return(h.body[-1]) is False
                    for h in last.handlers)):
        body = body[:-1] + last.body  # `try: return <test>` / `except ...: return False`: the test where it runs
    if not body or len(body) > 6 or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    for stmt in body[:-1]:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
            continue
        if (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1
                and isinstance(stmt.body[0], ast.Return) and literal_return(stmt.body[0]) in (True, False)):
            continue
        return None
    return body


def collect_function(info, func, locator, cls):
    body = predicate_body(func)
    if body is None:
        return
    value = body[-1].value
    local_cc = {}
    scope = Scope(None, info, locator, None, local_cc)
    for stmt in body[:-1]:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            collect_cc_assignment(local_cc, stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target], stmt.value, scope)
    if cls is None:
        subject = cc_subject(value, scope)
        if subject is not None and not isinstance(value, (ast.Compare, ast.BoolOp)):
            info.cc_funcs[func.name] = subject  # a capability value (`return major * 10 + minor`)
            return
    if PRED_NAME_RE.match(func.name) or pure_capability(value, local_cc):
        entry = {
            "def_node": (func, body, locator),
            "line": func.lineno + locator.line0,
            "source": locator.text(value, 300),
        }
        if cls is not None:
            entry["cls"] = cls
        info.predicates[func.name] = entry


def resolve_relative(info, module, level):
    if not level:
        return module or ""
    base = info.module
    if not info.rel.endswith("__init__.py"):
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def meaning_from_partial(value, info):
    """``lru_cache(...)(partial(_check, device_capability_majors=[12], cuda_version=(12, 8)))``."""
    for node in walk(value):
        if not isinstance(node, ast.Call) or last_name(node.func) != "partial" or not node.args:
            continue
        majors = None
        cuda = None
        for kw in node.keywords:
            val = literal(kw.value)
            if kw.arg and "major" in kw.arg and isinstance(val, list):
                majors = [v for v in val if isinstance(v, int)]
            elif kw.arg and "cuda" in kw.arg:
                cuda = version_tuple(val)
        positional = [literal(a) for a in node.args[1:]]
        if majors is None and positional and isinstance(positional[0], list):
            majors = [v for v in positional[0] if isinstance(v, int)]
            if len(positional) > 1:
                cuda = version_tuple(positional[1])
        if majors is not None:
            helper = last_name(node.args[0])
            if helper:
                info.helpers.add(helper)
            return {"majors": majors, "min_cuda": cuda}
    return None


def pure_capability(node, local_cc=None):
    """Is this expression about the GPU and nothing else (so its function is a predicate)?"""
    local_cc = local_cc or {}
    if isinstance(node, ast.BoolOp):
        return all(pure_capability(v, local_cc) for v in node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return pure_capability(node.operand, local_cc)
    if isinstance(node, ast.Compare):
        operands = [node.left] + list(node.comparators)
        if not any(mentions_device(o, local_cc) for o in operands):
            return False
        return all(mentions_device(o, local_cc) or literal(o) is not NO_VALUE or isinstance(o, ast.Name) for o in operands)
    name = last_name(node) if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) else None
    return bool(name and (PRED_NAME_RE.match(name) or PLATFORM_NAME_RE.match(name)))


def mentions_device(node, local_cc=None):
    for sub in walk(node):
        if local_cc and isinstance(sub, ast.Name) and local_cc.get(sub.id):
            return True
        name = last_name(sub) if isinstance(sub, (ast.Name, ast.Attribute, ast.Call)) else None
        if name and (name in CC_FUNCS or name in SM_FUNCS):
            return True
        if isinstance(sub, ast.Attribute) and (dotted(sub) or "").endswith("version.cuda"):
            return True
    return False


_FROM_IMPORT_RE = re.compile(r"^from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)


def import_in_text(info, name):
    """(module, name) of a module-level ``from m import name`` the parsed pieces do not hold (an
    import line names no token), or None."""
    if name not in info.source.text:
        return None
    for match in _FROM_IMPORT_RE.finditer(info.source.text):
        for part in match.group(2).strip("()").replace("\n", " ").split(","):
            words = part.split("#")[0].split()
            if words and (words[-1] == name) and (len(words) == 1 or words[-2] == "as"):
                module = match.group(1)
                level = len(module) - len(module.lstrip("."))
                return resolve_relative(info, module.lstrip(".") or None, level), words[0]
    return None


def gate_alias_names(info):
    """Module aliases whose value (or the value of an alias it names) mentions a capability token."""
    relevant = set()
    changed = True
    texts = {}
    for name, (value, locator) in info.aliases.items():
        # A narrowed alias's span is its `if`'s test, which may hold no token: read its parts.
        parts = value.values if getattr(value, "narrowed", False) else [value]
        texts[name] = " and ".join(locator.text(part, 100000) for part in parts)
    while changed:
        changed = False
        for name, text in texts.items():
            if name in relevant or any(t in name for t in TOKENS):
                continue
            if has_token(text, ()) or any(re.search(r"\b%s\b" % re.escape(r), text) for r in relevant):
                relevant.add(name)
                changed = True
    return sorted(relevant)


def narrow_aliases(info):
    """Narrow module aliases by the module-level ``if``s parsed so far (again after more pieces are
    parsed: the ``if`` may hold no token, only the alias's name); each ``if`` narrows once."""
    for piece in info.pieces:
        if piece.in_class:
            continue
        for stmt in piece.tree.body:
            if isinstance(stmt, ast.If) and (piece.line0, stmt.lineno) not in info.narrowed:
                info.narrowed.add((piece.line0, stmt.lineno))
                narrow_alias(info, stmt, Locator(info.source, piece))


def narrow_alias(info, stmt, locator):
    """``X = <gpu test>`` then ``if X and <more>: ... else: X = False`` at module level: past the
    ``if``, X holds only where ``<more>`` holds too (0.5.15 gpt_oss.py: ``_is_tinygemm_supported``
    is turned off on CUDA 13 by ``get_cuda_version()[0] < 13``), so the alias is read as
    ``<gpu test> and <more>``, not as its first value alone."""
    test = stmt.test
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)):
        return
    for inner in stmt.orelse:
        if not (isinstance(inner, ast.Assign) and len(inner.targets) == 1 and isinstance(inner.targets[0], ast.Name)
                and isinstance(inner.value, ast.Constant) and inner.value.value in (False, None)):
            continue
        name = inner.targets[0].id
        held = info.aliases.get(name)
        if held is None or held[1].source is not locator.source or held[1].indent != locator.indent:
            continue
        named = [v for v in test.values if isinstance(v, ast.Name) and v.id == name]
        if len(named) != 1:
            continue
        # The first value comes from another piece: move its positions into this piece's lines, so
        # one locator reads the whole narrowed value.
        first = ast.increment_lineno(copy.deepcopy(held[0]), held[1].line0 - locator.line0)
        narrowed = ast.BoolOp(op=ast.And(), values=[first if v is named[0] else v for v in test.values])
        narrowed.narrowed = True
        info.aliases[name] = (ast.copy_location(narrowed, test), locator)
