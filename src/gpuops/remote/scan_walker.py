"""Gate scan, stage 4: walk a piece's statements (functions, classes, ``if``/``while``, ``assert``,
``return``, assignments, any expression) and emit every maximal boolean expression that tests the
GPU as a gate: kind, polarity (a guard that refuses is -1), effect, reads, excerpt.
Host code: stdlib only, Python 3.8+."""

import ast
import re

from gpuops.remote.gate_tree import only_atoms
from gpuops.remote.scan_ast import (
    NO_VALUE, boolish, docstring_line, dotted, last_name, literal, params_of, statements, string_of,
)
from gpuops.remote.scan_constants import local_values
from gpuops.remote.scan_locator import TEXT_MAX
from gpuops.remote.scan_scope import FunctionContext, Scope
from gpuops.remote.scan_tree import bool_roots, build, interesting
from gpuops.remote.scan_values import collect_local_cc
from gpuops.remote.scan_vocabulary import PRED_NAME_RE, has_token


_IDENT_RE = re.compile(r"^[A-Za-z_]\w{2,80}$")

_NOTE_CALL_RE = re.compile(r"(log|warn|print|debug|info|error)", re.I)


# Names of a function's accumulators of reasons it refuses (`errors.append(...)`, then raised or
# returned) and of the variables a refusal's message is kept in (`disable_reason = "..."`).
_REFUSAL_NAME_RE = re.compile(r"(^|_)(errors?|reasons?|problems?|issues?|unsupported|failures?|why|msg|message)$", re.I)
# A message is prose: a string with a space in it. `return "mnnvl"` selects a backend, it refuses nothing.
_PROSE_RE = re.compile(r"\w\s+\w")
# ... and a refusal says so: "device is not SM120", "requires Hopper" ("sm120 kernel" is a value).
_REFUSAL_WORD_RE = re.compile(r"\b(not|only|requires?|required|needs?|unsupported|cannot|can't|must|disabled?|"
                              r"unavailable|incompatible|lacks?|no)\b", re.I)

# What a log line says when the path is refused and something else returned in its place ("FlashAttention
# is not supported on SM12.x; falling back to Torch SDPA"): fewer words than a refusal's message,
# since a log before `return <value>` more often just names the choice ("Using trtllm_mla on sm100").
_FALLBACK_LOG_RE = re.compile(r"\b(not supported|unsupported|not available|unavailable|incompatible|"
                              r"fall(s|ing)? ?back|cannot|can't)\b", re.I)


def rejection_shape(body, stmt=None, follows=False, fn_name="", within=()):
    """The way this if-body refuses the path it guards, by name (the catalogue of effect shapes in
    gates/README.md), or None when the body is the work itself (a branch):

    - ``raise``: ends in a raise;
    - ``exit``: returns nothing, False, None, 0 or an empty literal (or ``continue``);
    - ``sentinel``: returns a negative integer (``return -1``: "none", where the value is a count or
      a size the caller checks);
    - ``error_string``: returns a message (prose) that the caller turns into a fallback;
    - ``reason``: keeps a message in a refusal variable (``disable_reason = "..."``);
    - ``accumulate``: appends to an error accumulator (``errors.append(...)``);
    - ``fallback``: ``if not <GPU test>: return <value>`` with the work following the if: an early
      return of what the GPU gets instead (``return AttnMethod.MHA_CHUNKED_KV``); or ``if <GPU
      test>:`` whose body only logs that the path is not supported or falls back, then returns
      another value while the work follows (``logger.info("FA is not supported on SM12.x; falling
      back to SDPA"); return TORCH_SDPA``): the GPU it names is refused the path;
    - ``restrict``: only asserts (``if is_blackwell(): assert backend in (...)``): what the GPU it
      names may use is restricted, so that GPU does not get the path freely;
    - ``requirements``: only further refusals (``if sm_major == 9: if self._mtp_fn is None: raise``,
      or a ``try: import`` whose ``except`` returns or raises): an extra requirement for the GPU
      it names; every other GPU passes on to the work after it;
    - ``divert``: a test written "not this GPU" inside ``if x == A:`` that sets ``x`` to something
      else (``if ... and not fa4_head_size: target_backend = TORCH_SDPA``): the GPU that enters is
      sent away from A (``if backend == "auto": if is_sm100: backend = ...`` selects: a branch).

    Only logging may come before the refusal. ``stmt`` is the ``if`` (its test decides ``fallback``),
    ``follows`` whether statements follow it in its block, ``fn_name`` the function's name (a
    ``*_reason`` function's strings are its refusals)."""
    if not body:
        return None
    last = body[-1]
    if isinstance(last, ast.Raise):
        return "raise"  # whatever it did before, the path ends here
    if all(isinstance(s, ast.Assert) or _is_note(s) for s in body) and any(isinstance(s, ast.Assert) for s in body):
        return "restrict"
    if all(_is_note(s) or _is_refusal(s) for s in body) and any(_is_refusal(s) for s in body):
        return "requirements"
    if not all(_is_note(s) for s in body[:-1]):
        return None
    if is_denying_exit(last) or _is_exit_call(last):
        return "exit"
    if isinstance(last, ast.Return) and last.value is not None and _is_negative_int(last.value):
        return "sentinel"
    if isinstance(last, ast.Return) and _is_prose(last.value) and (
            _REFUSAL_WORD_RE.search(string_of(last.value) or "") or _REFUSAL_NAME_RE.search(fn_name or "")):
        return "error_string"
    if isinstance(last, ast.Return) and isinstance(last.value, ast.Tuple) and last.value.elts \
            and literal(last.value.elts[0]) in (False, None) and any(_is_prose(e) for e in last.value.elts[1:]):
        return "exit"  # `return False, "needs SM100"`: the refusal and its reason
    if isinstance(last, (ast.Assign, ast.AnnAssign)) and last.value is not None and _is_prose(last.value):
        targets = last.targets if isinstance(last, ast.Assign) else [last.target]
        if all(_REFUSAL_NAME_RE.search(last_name(t) or "") for t in targets if isinstance(t, (ast.Name, ast.Attribute))):
            return "reason"
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Attribute) \
            and last.value.func.attr in ("append", "add", "extend") \
            and _REFUSAL_NAME_RE.search(last_name(last.value.func.value) or ""):
        return "accumulate"
    if isinstance(last, ast.Return) and last.value is not None and follows and isinstance(stmt, ast.If) \
            and not stmt.orelse and _negated(stmt.test) and len(body) <= 3:
        return "fallback"
    if isinstance(last, ast.Return) and last.value is not None and follows and isinstance(stmt, ast.If) \
            and not stmt.orelse and any(_logs_fallback(s) for s in body[:-1]):
        return "fallback"  # the log says the path is refused; the value returned is what it gets instead
    if isinstance(last, ast.Assign) and len(last.targets) == 1 and isinstance(last.targets[0], ast.Name) \
            and isinstance(stmt, ast.If) and _negated(stmt.test) and any(re.search(r"(^|[^\w.])%s\s*==" % re.escape(last.targets[0].id), str(t)) for t in within):
        return "divert"
    return None


def _orelse(stmt):
    """What an ``if`` statement has after its body: ``"elif"`` (another test of its chain),
    ``"else"`` (a branch every GPU that fails the chain takes), or None."""
    if not isinstance(stmt, ast.If) or not stmt.orelse:
        return None
    return "elif" if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If) else "else"


def _ifexp_test(stmt, node):
    """Is ``node`` the test of a conditional expression (``A if test else B``) in ``stmt``?"""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False  # a decorator's expression: never a branch of the function's code
    return any(isinstance(n, ast.IfExp) and n.test is node for n in ast.walk(stmt))


# A suffix of an architecture list (`TORCH_CUDA_ARCH_LIST="9.0+PTX"`): PTX embedded beside that
# architecture's own code, the code itself unchanged. A compiler option is not one (a `-D` macro
# changes the code compiled); a math mode is read apart (`_MATH_MODE_RE`).
_FLAG_RE = re.compile(r"^\+[A-Za-z]\w*$")


def _flag_added(stmt, node):
    """For ``A if <node> else B`` in ``stmt``: the architecture-list suffix A adds where B adds
    nothing (``'+PTX' if arch == '9.0' else ''``), else None."""
    for n in ast.walk(stmt):
        if isinstance(n, ast.IfExp) and n.test is node:
            added = literal(n.body)
            flags = [added] if isinstance(added, str) else added if isinstance(added, (list, tuple)) else None
            if literal(n.orelse) in ("", [], (), None) and flags \
                    and all(isinstance(f, str) and _FLAG_RE.match(f) for f in flags):
                return " ".join(flags)[:TEXT_MAX]
            return None
    return None


# A floating-point math mode of a compiler (`--use_fast_math`, `-ftz=true`, `--prec-div=false`, or a
# build's name for one, "fast_math" / "precise_math"): the same kernel built with faster or exacter
# arithmetic. Picked for one other architecture only (`["--use_fast_math"] if arch == (9, 0) else []`,
# matching that architecture's prebuilt wheel), a quirk of it, not a path this GPU lacks (issue 43).
# Other options (`-D` macros, `-arch`) change what is compiled: not one.
_MATH_MODE_RE = re.compile(r"^(-{1,2}(use_fast_math|ftz|prec-div|prec-sqrt|fmad)(=\w+)?|\w*_math)$")


def _math_modes(node):
    """The math-mode options a literal names (``"--use_fast_math"``, ``["-ftz=true"]``; ``""`` and
    ``[]`` name none), or None when it is anything else."""
    value = literal(node)
    items = [] if value in ("", None) else [value] if isinstance(value, str) else \
        list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(f, str) and _MATH_MODE_RE.match(f) for f in items):
        return None
    return items


def _math_mode_chosen(stmt, node):
    """For ``A if <node> else B`` in ``stmt`` where each side only names math modes of the compiler
    (``"fast_math" if use_fast_math else "precise_math"``, ``["--use_fast_math"] if ... else []``):
    the mode A picks, else None."""
    for n in ast.walk(stmt):
        if isinstance(n, ast.IfExp) and n.test is node:
            body, other = _math_modes(n.body), _math_modes(n.orelse)
            return " ".join(body)[:TEXT_MAX] if body and other is not None else None
    return None


def math_mode_switches(func):
    """Names the function assigns once and reads only as the test of a math-mode choice
    (``use_fast_math = (arch.major, arch.minor) == (9, 0)`` read only by ``"fast_math" if
    use_fast_math else "precise_math"`` and ``["--use_fast_math"] if use_fast_math else []``):
    name -> the mode it picks."""
    assigned, tests, other = {}, {}, set()
    for n in ast.walk(func):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigned[t.id] = assigned.get(t.id, 0) + 1
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)) and isinstance(n.target, ast.Name):
            assigned[n.target.id] = 2
    for n in ast.walk(func):
        if isinstance(n, ast.IfExp) and isinstance(n.test, ast.Name):
            mode = _math_mode_chosen(n, n.test)
            if mode is not None:
                tests.setdefault(n.test.id, mode)
                continue
        for child in ast.iter_child_nodes(n):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and not (
                    isinstance(n, ast.IfExp) and child is n.test and _math_mode_chosen(n, child) is not None):
                other.add(child.id)
    return {name: mode for name, mode in tests.items() if assigned.get(name) == 1 and name not in other}


def _is_refusal(stmt):
    """A nested refusal: an ``if`` (no else) whose body refuses, or a ``try`` of imports whose every
    ``except`` ends in a return or a raise (the requirement is that the import works)."""
    if isinstance(stmt, ast.If):
        return not stmt.orelse and rejection_shape(stmt.body, stmt) is not None
    if isinstance(stmt, ast.Try):
        return bool(stmt.handlers) and all(isinstance(s, (ast.Import, ast.ImportFrom)) or _is_note(s) for s in stmt.body) \
            and all(h.body and isinstance(h.body[-1], (ast.Return, ast.Raise)) for h in stmt.handlers)
    return False


def _is_exit_call(stmt):
    """``sys.exit(...)``, ``exit()``, ``os._exit(...)``: the program stops here."""
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
        and dotted(stmt.value.func) in ("sys.exit", "exit", "quit", "os._exit")


def _is_negative_int(node):
    value = literal(node)
    return isinstance(value, int) and not isinstance(value, bool) and value < 0


def _is_note(stmt):
    """Logging, a docstring, ``pass``, or the message being written for the log (``message =
    "... requires SM100 ..." % (...)``): what may come before a refusal."""
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        # `(logger.warning if explicit else logger.info)(message)`: a log call either way
        callees = [func.body, func.orelse] if isinstance(func, ast.IfExp) else [func]
        if all(_NOTE_CALL_RE.search(dotted(c) or "") for c in callees):
            return True
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
            and _is_prose(stmt.value):
        return True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _logs_fallback(stmt):
    """A log call whose message says the path is not supported here or falls back."""
    if not (_is_note(stmt) and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value.args):
        return False
    return bool(_FALLBACK_LOG_RE.search(string_of(stmt.value.args[0]) or ""))


def _is_prose(node):
    text = string_of(node) if node is not None else None
    return bool(text) and bool(_PROSE_RE.search(text))


def _negated(test):
    """Is the test written as "not this GPU" (``not is_sm100()``, ``cap != (9, 0)``, ``major not in ...``)?"""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.NotEq, ast.NotIn)):
        return True
    if isinstance(test, ast.BoolOp):
        return all(_negated(v) for v in test.values)
    return False


def is_denying_exit(stmt):
    if isinstance(stmt, (ast.Raise, ast.Continue)):
        return True
    if isinstance(stmt, ast.Return):
        if stmt.value is None:
            return True
        value = literal(stmt.value)
        return value is not NO_VALUE and (value is None or value is False or value in ([], {}, "", 0))
    return False


# Calls that only compute a number from their arguments: `num_warps = min(num_warps, 8)` adjusts.
_ARITHMETIC_CALLS = frozenset(("min", "max", "int", "float", "round", "abs", "bool", "math.ceil", "math.floor"))


def only_adjusts(body):
    """Does the body only adjust values the code already holds (``scale = scale * SM100_FIX``,
    ``num_warps = min(num_warps, 8)``, ``x += 1``), logging aside? Such a branch tunes what every
    GPU computes for the GPUs it admits; it is no path of its own (a call such as ``fused(x)``
    or ``x.to(...)`` is: it does work)."""
    adjusted = False
    for stmt in body:
        if _is_note(stmt):
            continue
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, (ast.Name, ast.Attribute)) \
                and _arithmetic(stmt.value):
            adjusted = True
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], (ast.Name, ast.Attribute)) and _arithmetic(stmt.value):
            target = dotted(stmt.targets[0])
            if target is not None and any(dotted(n) == target for n in ast.walk(stmt.value)
                                          if isinstance(n, (ast.Name, ast.Attribute))):
                adjusted = True
                continue
        return False
    return adjusted


def _arithmetic(value):
    """No call but the arithmetic built-ins (``_ARITHMETIC_CALLS``): operators over values."""
    return all(dotted(node.func) in _ARITHMETIC_CALLS for node in ast.walk(value) if isinstance(node, ast.Call))


def _only_selects(body):
    """The body only assigns values, calling nothing (``backend = "flashinfer_cutedsl"``, ``cfg = (1,
    None)``), between notes: a choice of a value, not work (``set_fa_ver(4)`` turns FA4 on)."""
    assigns = [s for s in body if isinstance(s, (ast.Assign, ast.AnnAssign))]
    return bool(assigns) and all(isinstance(s, (ast.Assign, ast.AnnAssign)) or _is_note(s) for s in body) \
        and not any(isinstance(n, ast.Call) for s in assigns for n in ast.walk(s))


def body_effect(body, locator):
    effect = {}
    sets = []
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    name = last_name(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                    if name and name not in sets:
                        sets.append(name)
            elif isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
                for key in node.value.keys:
                    if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value not in sets:
                        sets.append(key.value)
    if sets:
        effect["sets"] = sets[:20]
    if only_adjusts(body):
        effect["adjusts"] = True
    if _only_selects(body):
        effect["selects"] = True
    if any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in body) \
            and all(isinstance(s, (ast.Import, ast.ImportFrom)) or _is_note(s) for s in body):
        effect["imports"] = True  # it only makes names available: what runs is decided where they are used
    last = body[-1] if body else None
    if isinstance(last, ast.Raise) and last.exc is not None:
        exc = last.exc
        effect["raises"] = last_name(exc.func if isinstance(exc, ast.Call) else exc) or "?"
        if isinstance(exc, ast.Call) and exc.args:
            message = string_of(exc.args[0])
            if message is not None:
                effect["message"] = message[:TEXT_MAX]
    elif isinstance(last, ast.Return):
        if last.value is None:
            effect["returns"] = None
        else:
            value = literal(last.value)
            effect["returns"] = locator.text(last.value, 120) if value is NO_VALUE else value
    return effect


def function_locals(func, scanner, info, locator=None):
    """Single-assignment names holding a capability expression, names bound to capability values,
    and every name the function assigns.

    Only statements are walked (never every expression): assignments are statements.
    """
    counts = {}
    values = {}
    source = info.source
    for node in statements(func.body):
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
                    isinstance(n, ast.Name) and (n.id in local_aliases or n.id in cc_vars) for n in ast.walk(value)):
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
            self.walk_stmt(stmt, fn, within, follows=index + 1 < len(body))

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
        return head

    def emit(self, stmt, node, tree, fn, within, kind, polarity, effect, scope, chain=None, orelse=None):
        line = tree["span"][0]
        end = max(tree["span"][2], line)
        stmt_line = stmt.lineno + self.locator.line0
        excerpt_end = end + (1 if isinstance(stmt, (ast.If, ast.While)) else 0)
        reads = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                reads.add(sub.id)
            elif isinstance(sub, ast.Attribute):
                reads.add(sub.attr)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _IDENT_RE.match(sub.value):
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
        if orelse is None and kind == "expr" and _ifexp_test(stmt, node):
            orelse = "else"  # `A if <GPU test> else B`: a branch for each side
            flag = _flag_added(stmt, node)
            if flag is not None:
                self.found[-1]["effect"] = dict(effect, flag=flag)
            mode = _math_mode_chosen(stmt, node)
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

    def walk_stmt(self, stmt, fn, within, follows=False):
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
            inner.math_switches = math_mode_switches(stmt)
            self.walk_body(stmt.body, inner, [])
            return
        if isinstance(stmt, ast.ClassDef):
            qual = (fn.qual + "." if fn.qual else "") + stmt.name
            self.walk_body(stmt.body, FunctionContext(qual, docstring_line(stmt), {}, {}), [])
            return
        if isinstance(stmt, (ast.If, ast.While)):
            chain = self.chain_head(stmt) if isinstance(stmt, ast.If) else None
            found, scope = self.roots(stmt.test, fn)
            test_is_root = any(n is stmt.test for n, _ in found)
            for node, tree in found:
                if node is stmt.test:
                    shape = rejection_shape(stmt.body, stmt, follows, fn.qual.split(".")[-1], within) if isinstance(stmt, ast.If) else None
                    kind = "guard" if shape else ("if" if isinstance(stmt, ast.If) else "while")
                    effect = body_effect(stmt.body, self.locator)
                    if shape:
                        effect["shape"] = shape  # how the body refuses: gates/README.md's catalogue
                    self.emit(stmt, node, tree, fn, within, kind, -1 if shape else 1, effect, scope,
                              chain=chain, orelse=_orelse(stmt))
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
                self.emit(stmt, node, tree, fn, within, "return" if node is stmt.value else "expr", 1, {}, scope)
            self.emit_nested(stmt, fn, within, scope)
            return
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [last_name(t) for t in targets if isinstance(t, (ast.Name, ast.Attribute))]
            if not fn.qual and all(isinstance(t, ast.Name) for t in targets) and self.pure_alias(stmt.value):
                return  # a module alias such as `_is_sm100_supported = _is_cuda and is_sm100_supported()`
            found, scope = self.roots(stmt.value, fn)
            for node, tree in found:
                effect = {"sets": [n for n in names if n]} if node is stmt.value else {}
                switched = [fn.math_switches.get(n) for n in names]
                if effect and switched and all(switched):
                    effect["math_mode"] = switched[0]  # `use_fast_math = cap == (9, 0)`, read only as one
                self.emit(stmt, node, tree, fn, within, "assign" if node is stmt.value else "expr", 1, effect, scope)
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
