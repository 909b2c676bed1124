"""Gate scan, condition tree: ``build`` turns a boolean expression into and/or/not over ``cap`` atoms
(predicates, capability and CUDA comparisons), ``platform`` atoms, ``alias`` nodes and opaque
``clause`` leaves, each with its exact span; ``bool_roots`` finds the maximal ones that are gates.
The tree's shape, and the walks both sides make of it, are in ``gate_tree``. Host code: stdlib only,
Python 3.8+."""

import ast

from gpuops.remote.gate_tree import has_atoms, is_gate_tree
from gpuops.remote.scan_ast import (
    AST_INDEX, CMP_OPS, NO_VALUE, boolish, child_nodes, dotted, flip, last_name, literal, version_tuple, walk,
)
from gpuops.remote.scan_discovery import module_files
from gpuops.remote.scan_constants import constant_choices
from gpuops.remote.scan_scope import Scope
from gpuops.remote.scan_values import (
    cc_subject, cuda_subject, cuda_version_of, member_values, param_shaped, self_subjects,
)
from gpuops.remote.scan_vocabulary import (
    CAP_NAME_RE, CC_FUNCS, PLATFORM_NAME_RE, PRED_NAME_RE, PROPS_FUNCS, SM_FUNCS, capability_like,
)


def build(node, scope, depth=0):
    """The condition tree of ``node``: and/or/not over cap atoms, platform atoms, aliases, clauses."""
    span = scope.locator.span(node)
    if depth > 40:
        return clause(node, scope, span)
    if isinstance(node, ast.BoolOp):
        return {"op": "and" if isinstance(node.op, ast.And) else "or",
                "args": [build(v, scope, depth + 1) for v in node.values], "span": span,
                "text": scope.locator.text(node)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return {"op": "not", "arg": build(node.operand, scope, depth + 1), "span": span,
                "text": scope.locator.text(node)}
    atom = cap_atom(node, scope)
    if atom is not None:
        return {"op": "cap", "atom": atom, "span": span, "text": scope.locator.text(node)}
    platform = platform_atom(node)
    if platform is not None:
        return {"op": "platform", "name": platform, "span": span, "text": scope.locator.text(node)}
    if isinstance(node, ast.Name):
        expanded = expand_alias(node.id, scope, depth)
        if expanded is not None:
            return {"op": "alias", "name": node.id, "expr": expanded[0], "scope": expanded[1],
                    "span": span, "text": node.id}
        if (scope.fn is not None and scope.scanner is not None and node.id in scope.fn.params
                and PRED_NAME_RE.match(node.id) and node.id not in scope.cc_vars):
            # A bool parameter is a GPU test only when every call site passes the same one.
            flowed = scope.scanner.param_predicate(scope.info, scope.fn, node.id)
            if flowed is not None:
                return {"op": "alias", "name": node.id, "expr": flowed, "scope": "parameter",
                        "span": span, "text": node.id}
    if isinstance(node, ast.Compare):
        compared = compare_atoms(node, scope)
        if compared is not None:
            return dict(compared, span=span, text=scope.locator.text(node))
        lookup = table_lookup(node, scope)
        if lookup is not None:
            # `ws in TABLE[capability]`: only a capability among TABLE's keys gets past this
            # statement (any other raises KeyError), whichever way the test goes: a requirement
            # of the gate, beside its condition.
            scope.requires.append(dict(lookup, span=span, text=scope.locator.text(node)))
            return clause(node, scope, span)
    if isinstance(node, ast.Attribute) and scope.scanner is not None and depth < 20:
        module = module_of_ref(node.value, scope)
        if module is not None:
            # `deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0`: another module's alias of a GPU test.
            found = scope.scanner.module_alias(module, node.attr)
            if found is not None:
                value, locator, other = found
                inner = Scope(scope.scanner, other, locator)
                inner.expanding = scope.expanding
                key = "%s.%s" % (module, node.attr)
                if key not in scope.expanding and boolish(value) and interesting(value, inner):
                    scope.expanding.add(key)
                    try:
                        tree = build(value, inner, depth + 1)
                    finally:
                        scope.expanding.discard(key)
                    if has_atoms(tree, ("cap", "platform")):
                        return {"op": "alias", "name": dotted(node) or node.attr, "expr": tree, "scope": "import",
                                "span": span, "text": scope.locator.text(node)}
    return clause(node, scope, span)


def clause(node, scope, span):
    out = {"op": "clause", "text": scope.locator.text(node), "span": span}
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        ref = dotted(node.left)
        right = node.comparators[0]
        value = literal(right)
        if value is NO_VALUE and isinstance(right, ast.Name):
            value = scope.scanner.constant(scope.info, right.id)
        if ref is not None:
            out["ref"] = ref
            out["cmp"] = CMP_OPS.get(type(node.ops[0]), "?")
            if value is not NO_VALUE:
                out["value"] = value
            else:
                other = dotted(right)
                if other is not None:
                    out["value_ref"] = other
    else:
        ref = dotted(node)
        if ref is not None:
            out["ref"] = ref
    # An atom inside a call (its arguments, keyword arguments too) or an arithmetic clause is a
    # gate of its own.
    for child in child_nodes(node):
        if isinstance(child, ast.keyword):
            child = child.value
        if isinstance(child, ast.expr):
            scope.nested.extend(bool_roots(child, scope))
    return out


def cap_atom(node, scope):
    info = scope.info
    if isinstance(node, ast.Call):
        name = last_name(node.func)
        if name and (PRED_NAME_RE.match(name) or scope.scanner.is_predicate(name)) and name not in info.helpers:
            if isinstance(node.func, ast.Name) and scope.shadowed(name):
                return None  # a parameter or local that happens to hold a callable
            method = isinstance(node.func, ast.Attribute) and not is_module_ref(node.func.value, scope)
            return pred_atom(name, "method" if method else "call", scope)
        return None
    if isinstance(node, ast.Attribute):
        attr = node.attr
        if PRED_NAME_RE.match(attr) and not isinstance(node.ctx, ast.Store):
            mapped = scope.scanner.platform_map.get(attr)
            base = dotted(node.value) or ""
            if mapped or "platform" in base.lower():
                atom = pred_atom(mapped or attr, "platform", scope)
                atom["attr"] = attr
                return atom
            return pred_atom(attr, "attr", scope)
        return None
    if isinstance(node, ast.Name):
        name = node.id
        if name in scope.local_aliases or name in info.aliases or scope.shadowed(name):
            return None  # parameters and locals are never predicates unless their value is one
        if PRED_NAME_RE.match(name):
            return pred_atom(name, "name", scope)
    return None


def pred_atom(name, form, scope):
    return {"kind": "pred", "name": name, "form": form, "def": scope.scanner.resolve_predicate(scope.info, name, form)}


def platform_atom(node):
    if isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("cuda.is_available"):
        return "cuda"  # torch.cuda.is_available(): true on a CUDA host
    if isinstance(node, ast.Call):
        name = last_name(node.func)
    elif isinstance(node, (ast.Name, ast.Attribute)):
        name = last_name(node)
    else:
        return None
    if name and PLATFORM_NAME_RE.match(name):
        bare = name.lstrip("_")[3:]
        for suffix in ("_static", "_runtime"):
            if bare.endswith(suffix):
                return bare[: -len(suffix)]
        return bare
    return None


def module_of_ref(node, scope):
    """The module a name such as ``u`` (``import sglang.srt.utils as u``) or ``deep_gemm_wrapper``
    (``from sglang.srt.layers import deep_gemm_wrapper``) stands for, or None."""
    if not isinstance(node, ast.Name) or scope.shadowed(node.id):
        return None
    info = scope.info
    if node.id in info.imports:
        module, name = info.imports[node.id]
        full = module + "." + name
        if any(rel in scope.scanner.texts for rel in module_files(full)):
            return full
        return None
    module = info.module_names.get(node.id)
    return module if module and module.startswith("sglang") else None


def is_module_ref(node, scope):
    """``u`` in ``u.is_sm100_supported()`` where ``u`` is a module (``import sglang.srt.utils as u``,
    ``from sglang.srt import utils``): a module function, not an object's method."""
    if isinstance(node, ast.Attribute):
        return is_module_ref(node.value, scope)
    if not isinstance(node, ast.Name):
        return False
    info = scope.info
    if node.id in info.module_names:
        return True
    if node.id in info.imports and scope.scanner is not None:
        module, name = info.imports[node.id]
        return any(rel in scope.scanner.texts for rel in module_files(module + "." + name))
    return False


def expand_alias(name, scope, depth):
    if name in scope.expanding:
        return None
    if name in scope.local_aliases:
        value, where = scope.local_aliases[name], "local"
        # Its own scope: tests nested inside the value (a call's arguments) are gates where the
        # value is written, never again at every use of the name.
        inner_scope = Scope(scope.scanner, scope.info, scope.locator, scope.local_aliases, scope.cc_vars, scope.fn)
        inner_scope.expanding = scope.expanding
    elif name in scope.info.aliases:
        value, locator = scope.info.aliases[name]
        where = "module"
        inner_scope = Scope(scope.scanner, scope.info, locator)
        inner_scope.expanding = scope.expanding
    else:
        return None
    if not (boolish(value) and interesting(value, inner_scope)):
        return None
    scope.expanding.add(name)
    try:
        tree = build(value, inner_scope, depth + 1)
    finally:
        scope.expanding.discard(name)
    if not has_atoms(tree, ("cap", "platform")):
        return None
    return tree, where


def compare_atoms(node, scope):
    operands = [node.left] + list(node.comparators)
    atoms = []
    for left, op, right in zip(operands, node.ops, operands[1:]):
        opname = CMP_OPS.get(type(op))
        if opname in ("is", "is not"):
            # `capability is not None`, `torch.version.cuda is not None`: is there a CUDA GPU (true
            # on the hosts gpuops judges), not which one. Anything else is not ours to read.
            if len(node.ops) == 1 and literal(right) is None and (cc_subject(left, scope) or cuda_subject(left)):
                there = {"op": "platform", "name": "cuda"}
                return there if opname == "is not" else {"op": "not", "arg": there}
            return None
        subject, value, flipped = cc_subject(left, scope), right, False
        if subject is None:
            subject, value, flipped = cc_subject(right, scope), left, True
        if subject is None and scope.fn is not None and scope.fn.params:
            # A parameter compared with what looks like a capability: a capability if every call
            # site in the tree passes one.
            for side, other, flag in ((left, right, False), (right, left, True)):
                if param_shaped(side, scope) and capability_like(member_values(other, scope)):
                    scope.param_flow = True
                    try:
                        subject = cc_subject(side, scope)
                    finally:
                        scope.param_flow = False
                    if subject is not None:
                        value, flipped = other, flag
                        break
        if subject is not None:
            val = member_values(value, scope)
            if flipped and opname in ("in", "not in"):
                val = NO_VALUE  # `x in <capability>`: not a comparison gpuops reads
            choices, unmatched = [], None
            if val is NO_VALUE and opname not in ("in", "not in"):
                # A constant method or parameter: every value it can have (scan_constants).
                found = constant_choices(value, scope)
                choices = [] if found is NO_VALUE else sorted({repr(v): v for v in found}.values(),
                                                                 key=lambda v: (isinstance(v, list), v))
                passed = choices
                if choices and subject in ("cc", "major", "minor", "sm") and _is_param(value, scope):
                    # What the callers pass, of the kind this comparison takes: a (major, minor)
                    # tuple for a tuple, a number for a number (`if isinstance(capability,
                    # tuple): return cap >= capability` is for tuple arguments only).
                    choices = [v for v in choices if isinstance(v, list) == (subject == "cc")]
                if len(choices) == 1:
                    val, choices = choices[0], []
                elif passed and not choices:
                    unmatched = {"param": value.id, "passed": passed}
            atom = {"kind": "cc", "subject": subject, "cmp": flip(opname) if flipped else opname,
                    "value": None if val is NO_VALUE else val}
            if choices:
                atom["any_of"] = choices
            if unmatched:
                atom["unmatched"] = unmatched  # no caller passes a value this comparison is made with
            atoms.append({"op": "cap", "atom": atom})
            continue
        held = cuda_version_of(left, scope) or cuda_version_of(right, scope)
        if held is not None:
            flipped = cuda_version_of(left, scope) is None
            val = literal(left if flipped else right)
            atom = {"kind": "cuda", "cmp": flip(opname) if flipped else opname}
            if held == "major":  # `cuda_major < 13`: the major alone is compared
                atom["subject"] = "major"
                atom["value"] = [val] if isinstance(val, int) and not isinstance(val, bool) else None
            else:
                atom["value"] = None if val is NO_VALUE else version_tuple(val)
            atoms.append({"op": "cap", "atom": atom})
            continue
        return None
    if len(atoms) == 1:
        return atoms[0]
    return {"op": "and", "args": atoms}


def _is_param(node, scope):
    return isinstance(node, ast.Name) and scope.fn is not None and node.id in (scope.fn.params or ())


def table_lookup(node, scope):
    """``TABLE[<capability>]`` among a comparison's operands, TABLE a literal dict: the atom
    "capability in TABLE's keys", or None."""
    for operand in [node.left] + list(node.comparators):
        if not isinstance(operand, ast.Subscript):
            continue
        index = operand.slice.value if isinstance(operand.slice, AST_INDEX) else operand.slice
        subject = cc_subject(index, scope)
        if subject is None:
            continue
        keys = member_values(operand.value, scope)
        if isinstance(keys, list) and keys:
            return {"op": "cap", "atom": {"kind": "cc", "subject": subject, "cmp": "in", "value": keys}}
    return None


def interesting(node, scope):
    """Cheap pre-check: does this expression mention anything a gate is made of?"""
    info = scope.info
    for sub in walk(node):
        if isinstance(sub, ast.Name):
            name = sub.id
            if (name in scope.local_aliases or name in info.aliases or name in scope.cc_vars
                    or name in CC_FUNCS or name in SM_FUNCS or name in PROPS_FUNCS
                    or PRED_NAME_RE.match(name) or scope.scanner.is_predicate(name)
                    or info.cc_vars.get(name) or info.cc_funcs.get(name) or name in scope.scanner.flow_imports(info)):
                return True
            if scope.fn is not None and name in scope.fn.params and CAP_NAME_RE.search(name):
                return True
        elif isinstance(sub, ast.Attribute):
            if PRED_NAME_RE.match(sub.attr) or sub.attr in CC_FUNCS or sub.attr in SM_FUNCS or sub.attr in (
                    "device_capability", "device_sm") or sub.attr in PROPS_FUNCS or scope.scanner.is_predicate(sub.attr):
                return True
            if sub.attr in ("major", "minor") and isinstance(sub.value, ast.Name) and scope.fn is not None \
                    and sub.value.id in scope.fn.params:
                return True
            if isinstance(sub.value, ast.Name) and sub.value.id == "self" and sub.attr in self_subjects(scope):
                return True
    return False


def bool_roots(node, scope):
    """The maximal boolean expressions under ``node`` that hold a capability test, as trees."""
    if not interesting(node, scope):
        return []
    if boolish(node):
        before = len(scope.requires)
        tree = build(node, scope)
        if is_gate_tree(tree) or len(scope.requires) > before:
            return [(node, tree)]
        return []  # build() queued any gates nested in its clauses on scope.nested
    found = []
    for child in child_nodes(node):
        if isinstance(child, ast.keyword):
            child = child.value
        if isinstance(child, ast.expr):
            found.extend(bool_roots(child, scope))
        elif isinstance(child, ast.comprehension):
            for part in [child.iter] + list(child.ifs):
                found.extend(bool_roots(part, scope))
    return found
