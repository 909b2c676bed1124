"""Gate scan, stage 4: walk a piece's statements (functions, classes, ``if``/``while``, ``assert``,
``return``, assignments, any expression) and emit every maximal boolean expression that tests the
GPU as a gate: kind, polarity (a guard that refuses is -1), effect (``scan_effects``), reads, excerpt.
Host code: stdlib only, Python 3.8+."""

import ast
import re

from gpuops.remote.gate_tree import only_atoms
from gpuops.remote.scan_ast import (
    boolish, docstring_line, function_statements, last_name, params_of, walk,
)
from gpuops.remote.scan_constants import local_values
from gpuops.remote.scan_effects import (
    IDENT_RE, body_effect, flag_added, generic_choices, ifexp_test, literal_choices, literal_table, math_mode_chosen,
    math_mode_returned, math_mode_switches, names_a_platform, negated_methods, orelse_kind, rejection_shape,
)
from gpuops.remote.scan_scope import FunctionContext, Scope
from gpuops.remote.scan_tree import bool_roots, build, interesting
from gpuops.remote.scan_values import collect_local_cc
from gpuops.remote.scan_vocabulary import PRED_NAME_RE, has_token


def function_locals(func, scanner, info, locator=None):
    """Single-assignment names holding a capability expression, names bound to capability values,
    and every name the function assigns.

    Only statements are walked (never every expression): assignments are statements.
    """
    counts = {}
    values = {}
    source = info.source
    for node in function_statements(func):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
        else:
            continue
        weight = 2 if isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)) else 1
        for target in targets:
            if isinstance(target, ast.Name):
                counts[target.id] = counts.get(target.id, 0) + weight
            elif isinstance(target, (ast.Tuple, ast.List)):
                for elt in target.elts:
                    if isinstance(elt, ast.Name):
                        counts[elt.id] = counts.get(elt.id, 0) + weight
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = (node, node.value)
    cc_vars = {}
    params = params_of(func)
    scope = Scope(scanner, info, locator, None, cc_vars)
    scope.fn = FunctionContext("", None, {}, cc_vars, params, counts)
    line0 = getattr(func, "_gpuops_line0", 0)
    first, last = func.lineno + line0, (getattr(func, "end_lineno", None) or func.lineno) + line0
    body_text = "".join(source.lines[first - 1:last])
    if has_token(body_text, ()) or "major" in body_text or any(
            n in body_text for n in info.cc_funcs) or any(n in body_text for n, v in info.cc_vars.items() if v) or (
            scanner is not None and any(n in body_text for n in scanner.flow_imports(info))):
        collect_local_cc(func, scope, cc_vars)  # only where a capability can be named at all
    local_aliases = {}
    candidates = {name: pair for name, pair in values.items()
                  if counts.get(name) == 1 and name not in cc_vars and boolish(pair[1])}
    changed = True
    while changed:  # an alias of an alias (`b = a and x` after `a = is_sm100_supported()`) counts too
        changed = False
        for name, (stmt, value) in candidates.items():
            if name in local_aliases:
                continue
            first, last = stmt.lineno + line0, (stmt.end_lineno or stmt.lineno) + line0
            if source.mentions_words(first, last) or any(
                    isinstance(n, ast.Name) and (n.id in local_aliases or n.id in cc_vars) for n in walk(value)):
                local_aliases[name] = value
                changed = True
    return local_aliases, cc_vars, params, set(counts)


def mark_early_return_chains(body, line0):
    """Consecutive ``if`` statements (none with an ``else``) of one block, each but the last ending in
    a return or a raise, are one dispatch written without ``elif`` (``if cap[0] == 9: return
    "hopper"`` then ``if cap[0] >= 10: return "blackwell"``): each is reached only by what the ones
    before it let through, as an elif is. They are marked as the chain of the first one's line
    (``GateWalker.chain_head``)."""
    head = None  # the first ``if`` of the run, while the last one seen ends in a return or a raise
    for stmt in body:
        if not isinstance(stmt, ast.If) or stmt.orelse:
            head = None
            continue
        if head is not None:
            chain = head.lineno + line0
            head._gpuops_chain = chain
            stmt._gpuops_chain = chain
        exits = bool(stmt.body) and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
        head = (head or stmt) if exits else None


class MathSwitches(object):
    """``math_mode_switches`` of a function, read when a gate's assignment first asks it: an
    assignment that is a gate is rare, and the question walks the whole function."""

    __slots__ = ("func", "table")

    def __init__(self, func):
        self.func = func
        self.table = None

    def get(self, name):
        if self.table is None:
            self.table = math_mode_switches(self.func)
        return self.table.get(name)


class GateWalker(object):
    def __init__(self, scanner, info, locator):
        self.scanner = scanner
        self.info = info
        self.locator = locator
        self.found = []

    def walk_body(self, body, fn, within):
        line0 = self.locator.line0
        mark_early_return_chains(body, line0)
        source = self.info.source
        for index, stmt in enumerate(body):
            first = stmt.lineno + line0
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.decorator_list:
                first = min(first, stmt.decorator_list[0].lineno + line0)
            last = (getattr(stmt, "end_lineno", None) or stmt.lineno) + line0
            if not source.mentions_words(first, last) and not (fn.words and fn.mentions(source, first, last)):
                continue  # nothing a gate is made of is written in this statement
            self.walk_stmt(stmt, fn, within, follows=index + 1 < len(body),
                           after=body[index + 1] if index + 1 < len(body) else None)

    def scope(self, fn):
        return Scope(self.scanner, self.info, self.locator, fn.local_aliases, fn.cc_vars, fn)

    def chain_head(self, stmt):
        """The line of the first ``if`` of the if/elif chain ``stmt`` belongs to (the branches of
        one dispatch), or None when it has no elif and is no elif."""
        head = getattr(stmt, "_gpuops_chain", None)
        if head is None and len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If):
            head = stmt.lineno + self.locator.line0
        if head is not None and len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If):
            stmt.orelse[0]._gpuops_chain = head  # set before the orelse is walked
            stmt.orelse[0]._gpuops_head = getattr(stmt, "_gpuops_head", stmt)
        return head

    def generic_pick(self, stmt, fn):
        """Does this branch of an if/elif chain only pick values the chain's generic path picks
        too (``elif is_sm120_supported(): backend = "triton_kernel"`` where a later ``elif
        ep_size == 1 ...`` sets ``"triton_kernel"`` for any GPU)? Then it is no path of the GPU's
        own (issue 43, fix 12). The generic path's values are found once per chain, at its head."""
        head = getattr(stmt, "_gpuops_head", None)
        if head is None:
            if not (len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If)):
                return False  # no elif chain (an early-return sequence has no generic branch to read)
            head = stmt
        generic = getattr(head, "_gpuops_generic", None)
        if generic is None:
            generic = head._gpuops_generic = generic_choices(
                head, lambda test: bool(self.roots(test, fn)[0]) or names_a_platform(test))
        own = literal_choices(stmt.body)
        return bool(own) and own <= generic

    def emit(self, stmt, node, tree, fn, within, kind, polarity, effect, scope, chain=None, orelse=None):
        line = tree["span"][0]
        end = max(tree["span"][2], line)
        stmt_line = stmt.lineno + self.locator.line0
        excerpt_end = end + (1 if isinstance(stmt, (ast.If, ast.While)) else 0)
        reads = set()
        for sub in walk(node):
            if isinstance(sub, ast.Name):
                reads.add(sub.id)
            elif isinstance(sub, ast.Attribute):
                reads.add(sub.attr)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and IDENT_RE.match(sub.value):
                reads.add(sub.value)  # e.g. global_server_args_dict["enable_x"]
        reads = sorted(reads)
        requires, scope.requires = scope.requires, []
        self.found.append({
            "requires": requires,
            "file": self.info.rel,
            "line": line,
            "end_line": end,
            "stmt_line": stmt_line,
            "function": fn.qual or "<module>",
            "kind": kind,
            "polarity": polarity,
            "condition": tree,
            "text": self.locator.text(node),
            "within": list(within),
            "effect": effect,
            "reads": reads[:40],
            "doc": fn.doc,
            "excerpt": self.locator.excerpt(min(stmt_line, line), max(excerpt_end, line)),
        })
        if chain is not None:
            self.found[-1]["chain"] = chain
        if orelse is None and kind == "expr" and ifexp_test(stmt, node):
            orelse = "else"  # `A if <GPU test> else B`: a branch for each side
            flag = flag_added(stmt, node)
            if flag is not None:
                self.found[-1]["effect"] = dict(effect, flag=flag)
            mode = math_mode_chosen(stmt, node)
            if mode is not None:
                self.found[-1]["effect"] = dict(effect, math_mode=mode)
        if orelse is not None:
            self.found[-1]["orelse"] = orelse
        for nested_node, nested_tree in self.drain_nested(scope):
            self.emit(stmt, nested_node, nested_tree, fn, within, "expr", 1, {}, scope)

    def emit_nested(self, stmt, fn, within, scope):
        for node, tree in self.drain_nested(scope):
            self.emit(stmt, node, tree, fn, within, "expr", 1, {}, scope)

    def drain_nested(self, scope):
        out = []
        while scope.nested:
            item = scope.nested.pop(0)
            out.append(item)
        return out

    def roots(self, node, fn):
        scope = self.scope(fn)
        found = bool_roots(node, scope)
        return found, scope

    def walk_stmt(self, stmt, fn, within, follows=False, after=None):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined = self.info.predicates.get(stmt.name) or {}
            if stmt.name in self.info.helpers or (PRED_NAME_RE.match(stmt.name) and defined and (
                    (not fn.qual and not defined.get("cls")) or (fn.qual and defined.get("cls") == fn.qual))):
                return  # the release's predicate vocabulary (is_sm120(), ...), not a gate
            qual = (fn.qual + "." if fn.qual else "") + stmt.name
            stmt._gpuops_line0 = self.locator.line0
            local_aliases, cc_vars, params, assigned = function_locals(stmt, self.scanner, self.info, self.locator)
            for deco in stmt.decorator_list:
                self.expr_gates(stmt, deco, fn, within)
            inner = FunctionContext(qual, docstring_line(stmt), local_aliases, cc_vars, params, assigned,
                                    first_is_self=bool(params) and params[0] in ("self", "cls"))
            inner.values = local_values(stmt)  # what a compared name holds (scan_constants)
            inner.math_switches = MathSwitches(stmt)
            inner.alternative = fn.negated_by.get(stmt.name)
            self.walk_body(stmt.body, inner, [])
            return
        if isinstance(stmt, ast.ClassDef):
            qual = (fn.qual + "." if fn.qual else "") + stmt.name
            context = FunctionContext(qual, docstring_line(stmt), {}, {})
            context.negated_by = negated_methods(stmt)
            self.walk_body(stmt.body, context, [])
            return
        if isinstance(stmt, (ast.If, ast.While)):
            chain = self.chain_head(stmt) if isinstance(stmt, ast.If) else None
            found, scope = self.roots(stmt.test, fn)
            test_is_root = any(n is stmt.test for n, _ in found)
            for node, tree in found:
                if node is stmt.test:
                    mode = math_mode_returned(stmt, after)
                    shape = rejection_shape(stmt.body, stmt, follows, fn.qual.split(".")[-1], within) \
                        if isinstance(stmt, ast.If) and mode is None else None
                    kind = "guard" if shape else ("if" if isinstance(stmt, ast.If) else "while")
                    effect = body_effect(stmt.body, self.locator)
                    if mode:
                        effect["math_mode"] = mode  # `if arch == (9, 0): return ["--use_fast_math"]`, then `return []`
                    if not shape and literal_table(stmt):
                        effect["table"] = True
                    if shape:
                        effect["shape"] = shape  # how the body refuses: gates/README.md's catalogue
                    elif chain is not None and effect.get("selects") and self.generic_pick(stmt, fn):
                        effect["generic"] = True
                    self.emit(stmt, node, tree, fn, within, kind, -1 if shape else 1, effect, scope,
                              chain=chain, orelse=orelse_kind(stmt))
                else:
                    self.emit(stmt, node, tree, fn, within, "expr", 1, {}, scope)
            if not test_is_root:
                for node, tree in self.drain_nested(scope):
                    self.emit(stmt, node, tree, fn, within, "expr", 1, {}, self.scope(fn))
            test_text = self.locator.text(stmt.test, 200)
            self.walk_body(stmt.body, fn, within + [test_text])
            if stmt.orelse:
                self.walk_body(stmt.orelse, fn, within + ["not (%s)" % test_text])
            return
        if isinstance(stmt, ast.Assert):
            found, scope = self.roots(stmt.test, fn)
            for node, tree in found:
                self.emit(stmt, node, tree, fn, within, "assert" if node is stmt.test else "expr", 1, {}, scope)
            self.emit_nested(stmt, fn, within, scope)
            return
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            found, scope = self.roots(stmt.value, fn)
            for node, tree in found:
                # the method's value a sibling reads negated (`not cls.X()`): the two are one choice
                effect = {"alternative": fn.qual.rsplit(".", 1)[0] + "." + fn.alternative} \
                    if fn.alternative and node is stmt.value else {}
                self.emit(stmt, node, tree, fn, within, "return" if node is stmt.value else "expr", 1, effect, scope)
            self.emit_nested(stmt, fn, within, scope)
            return
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [last_name(t) for t in targets if isinstance(t, (ast.Name, ast.Attribute))]
            if not fn.qual and all(isinstance(t, ast.Name) for t in targets) and self.pure_alias(stmt.value):
                return  # a module alias such as `_is_sm100_supported = _is_cuda and is_sm100_supported()`
            found, scope = self.roots(stmt.value, fn)
            unused = self.unused_lambda(stmt, fn) if found else None
            for node, tree in found:
                effect = {"sets": [n for n in names if n]} if node is stmt.value else {}
                switched = [fn.math_switches.get(n) for n in names]
                if effect and switched and all(switched):
                    effect["math_mode"] = switched[0]  # `use_fast_math = cap == (9, 0)`, read only as one
                self.emit(stmt, node, tree, fn, within, "assign" if node is stmt.value else "expr", 1, effect, scope)
                if unused:
                    self.found[-1]["unused"] = unused
            self.emit_nested(stmt, fn, within, scope)
            return
        # Everything else: look inside its expressions, then its nested statements.
        for _field, value in ast.iter_fields(stmt):
            if isinstance(value, ast.expr):
                self.expr_gates(stmt, value, fn, within)
            elif isinstance(value, list):
                stmts = [v for v in value if isinstance(v, ast.stmt)]
                if stmts:
                    self.walk_body(stmts, fn, within)
                for v in value:
                    if isinstance(v, ast.expr):
                        self.expr_gates(stmt, v, fn, within)
                    elif isinstance(v, (ast.withitem,)):
                        self.expr_gates(stmt, v.context_expr, fn, within)
                    elif isinstance(v, ast.ExceptHandler):
                        self.walk_body(v.body, fn, within)
                    elif hasattr(ast, "match_case") and isinstance(v, ast.match_case):
                        self.walk_body(v.body, fn, within)

    def unused_lambda(self, stmt, fn):
        """The name a module-level ``name = lambda: <GPU test>`` binds when nothing in the tree names
        it again (``is_ampere_with_cuda_12_3 = lambda: _check(8)`` with no caller), else None: a test
        no code runs decides nothing (issue 43, fix 14)."""
        if fn.qual or not isinstance(stmt, ast.Assign) or not isinstance(stmt.value, ast.Lambda) \
                or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            return None
        name = stmt.targets[0].id
        if self.scanner is None or self.scanner.files_naming(name.encode()) != [self.info.rel]:
            return None
        own = self.scanner.texts.get(self.info.rel) or b""
        return name if len(re.findall(rb"\b" + re.escape(name.encode()) + rb"\b", own)) == 1 else None

    def expr_gates(self, stmt, expr, fn, within):
        found, scope = self.roots(expr, fn)
        for node, tree in found:
            self.emit(stmt, node, tree, fn, within, "expr", 1, {}, scope)
        for node, tree in self.drain_nested(scope):
            self.emit(stmt, node, tree, fn, within, "expr", 1, {}, scope)

    def pure_alias(self, value):
        scope = Scope(self.scanner, self.info, self.locator)
        if not boolish(value) or not interesting(value, scope):
            return False
        tree = build(value, scope)
        return only_atoms(tree)
