"""Gate scan, stage 4a: what a gate's body does (its effect): a refusal (raise, exit, a logged
``return None``, a sentinel), a fallback, a value it only adjusts or selects, a flag or compiler math
mode it adds for one architecture. ``scan_walker`` asks these of each gate it emits.
Host code: stdlib only, Python 3.8+."""

import ast
import re

from gpuops.remote.scan_ast import AST_INDEX, NO_VALUE, child_nodes, dotted, last_name, literal, string_of, walk
from gpuops.remote.scan_locator import TEXT_MAX
from gpuops.remote.scan_vocabulary import PLATFORM_NAME_RE

IDENT_RE = re.compile(r"^[A-Za-z_]\w{2,80}$")

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
# What a log line says when it announces that the path is turned off or refused for the GPUs that
# pass ("Disabling SGLANG_OPT_FP8_WO_A_GEMM: requires DeepGEMM JIT and sm100+"): the fallback words and
# the switching off itself. "Using the SM120 grouped GEMM" says none of them: it names a choice.
_REFUSAL_LOG_RE = re.compile(r"\b(disabl(e|es|ed|ing)|turn(s|ed|ing)? off|requires?|required|not supported|"
                             r"unsupported|not available|unavailable|incompatible|fall(s|ing)? ?back|cannot|can't)\b",
                             re.I)


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
    - ``warns``: only logs that the path is turned off or refused ("Disabling X: requires DeepGEMM
      JIT and sm100+"), no ``else``: it announces the refusal for the GPUs that pass (issue 43, fix
      6). The switch itself (``if not supported: envs.X.set(False)``) is not read as a refusal: the
      accuracy corpus labels 0.5.19 serving_hook.py:449 a branch sm120 takes (open), independent-8's
      reader blocked; which stands is the lead's call.

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
    if isinstance(stmt, ast.If) and not stmt.orelse:
        if all(_is_log(s) for s in body) and any(_logs_refusal(s) for s in body):
            return "warns"
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


def orelse_kind(stmt):
    """What an ``if`` statement has after its body: ``"elif"`` (another test of its chain),
    ``"else"`` (a branch every GPU that fails the chain takes), or None."""
    if not isinstance(stmt, ast.If) or not stmt.orelse:
        return None
    return "elif" if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If) else "else"


def ifexp_test(stmt, node):
    """Is ``node`` the test of a conditional expression (``A if test else B``) in ``stmt``?"""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False  # a decorator's expression: never a branch of the function's code
    return any(isinstance(n, ast.IfExp) and n.test is node for n in walk(stmt))


# A suffix of an architecture list (`TORCH_CUDA_ARCH_LIST="9.0+PTX"`): PTX embedded beside that
# architecture's own code, the code itself unchanged. A compiler option is not one (a `-D` macro
# changes the code compiled); a math mode is read apart (`_MATH_MODE_RE`).
_FLAG_RE = re.compile(r"^\+[A-Za-z]\w*$")


def flag_added(stmt, node):
    """For ``A if <node> else B`` in ``stmt``: the architecture-list suffix A adds where B adds
    nothing (``'+PTX' if arch == '9.0' else ''``), else None."""
    for n in walk(stmt):
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


def math_mode_chosen(stmt, node):
    """For ``A if <node> else B`` in ``stmt`` where each side only names math modes of the compiler
    (``"fast_math" if use_fast_math else "precise_math"``, ``["--use_fast_math"] if ... else []``):
    the mode A picks, else None."""
    for n in walk(stmt):
        if isinstance(n, ast.IfExp) and n.test is node:
            return _mode_chosen(n)
    return None


def _mode_chosen(ifexp):
    """``math_mode_chosen`` of a conditional expression's own test."""
    body, other = _math_modes(ifexp.body), _math_modes(ifexp.orelse)
    return " ".join(body)[:TEXT_MAX] if body and other is not None else None


def math_mode_returned(stmt, after):
    """For ``if test: return A`` followed in its block by ``return B`` (``after``), where each side
    only names math modes of the compiler and they differ (``if arch.major >= 10: return []`` then
    ``return ["--use_fast_math"]``): the mode A picks (``""`` for none), else None. The early return
    is the two sides of ``A if test else B``, a choice of math mode, not a refusal (issue 43, fix 12)."""
    if not (isinstance(stmt, ast.If) and not stmt.orelse and stmt.body and isinstance(after, ast.Return)
            and isinstance(stmt.body[-1], ast.Return) and all(_is_note(s) for s in stmt.body[:-1])):
        return None
    if stmt.body[-1].value is None or after.value is None:
        return None
    mine, other = _math_modes(stmt.body[-1].value), _math_modes(after.value)
    if mine is None or other is None or mine == other or not (mine or other):
        return None
    return " ".join(mine)[:TEXT_MAX]


def literal_table(stmt):
    """Do an ``if`` and its plain ``else`` each only give the same names numbers (``if arch ==
    "sm90": BLKQ = 64; BLKK = 128 else: BLKQ = 128; BLKK = 64``), notes aside? Then the branch is a
    row of per-architecture sizes, the ``else`` the row of every other GPU (issue 43, fix 12). A
    string is not one (``if major == 9: backend = "fa3" else: backend = "triton_attn"``: a kernel
    chosen, which the blind readers call a loss where sm120 gets the generic one)."""
    if not (isinstance(stmt, ast.If) and stmt.orelse) or orelse_kind(stmt) != "else":
        return False
    rows = [_literal_row(stmt.body), _literal_row(stmt.orelse)]
    return bool(rows[0]) and rows[0] == rows[1]


def _literal_row(body):
    """The names a block only assigns numbers to (``BLKQ = 64``, ``M, N = (64, 128)``), or None."""
    names = set()
    for stmt in body:
        if _is_note(stmt) and not isinstance(stmt, ast.Assign):
            continue
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1) or not _numbers(literal(stmt.value)):
            return None
        target = stmt.targets[0]
        elts = target.elts if isinstance(target, ast.Tuple) else [target]
        if not all(isinstance(e, ast.Name) for e in elts):
            return None
        names.update(e.id for e in elts)
    return names or None


def _numbers(value):
    """A number (not a bool), or a tuple or list of numbers."""
    items = value if isinstance(value, (tuple, list)) else [value]
    return bool(items) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items)


def math_mode_switches(func):
    """Names the function assigns once and reads only as the test of a math-mode choice
    (``use_fast_math = (arch.major, arch.minor) == (9, 0)`` read only by ``"fast_math" if
    use_fast_math else "precise_math"`` and ``["--use_fast_math"] if use_fast_math else []``):
    name -> the mode it picks."""
    nodes = walk(func)  # one walk, read up to three times (asked of every function the walker enters)
    tests, choosing = {}, set()
    for n in nodes:
        if isinstance(n, ast.IfExp) and isinstance(n.test, ast.Name):
            mode = _mode_chosen(n)
            if mode is not None:
                tests.setdefault(n.test.id, mode)
                choosing.add(id(n))
    if not tests:
        return {}  # no math-mode choice at all (nearly every function): nothing else to count
    assigned, other = {}, set()
    for n in nodes:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigned[t.id] = assigned.get(t.id, 0) + 1
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)) and isinstance(n.target, ast.Name):
            assigned[n.target.id] = 2
    for n in nodes:
        if id(n) in choosing:
            continue  # its test is read as the choice (and its sides are literals)
        for child in child_nodes(n):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                other.add(child.id)
    return {name: mode for name, mode in tests.items() if assigned.get(name) == 1 and name not in other}


def negated_methods(classdef):
    """The class's methods that another of its methods reads negated (``not cls.X()``, ``not
    self.X()``): X -> the name of the first method that does (``enable_combine_shared_two_stream_overlap``
    returns ``... and not cls.enable_dispatch_shared_one_stream_overlap()``): the two are the sides
    of one choice, and what X's value withholds, the other gives (issue 43, fix 11)."""
    methods = [s for s in classdef.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names = {m.name for m in methods}
    found = {}
    for method in methods:
        for node in walk(method):
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and isinstance(node.operand, ast.Call) \
                    and isinstance(node.operand.func, ast.Attribute) and isinstance(node.operand.func.value, ast.Name) \
                    and node.operand.func.value.id in ("cls", "self") and not node.operand.args:
                name = node.operand.func.attr
                if name in names and name != method.name:
                    found.setdefault(name, method.name)
    return found


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


def _is_log(stmt):
    """A note (``_is_note``) whose call, if any, is a log call by its own name (``logger.warning``,
    ``print_warning_once``), not a method of something named like one: ``_UNTUNED_ARCH_WARNED.add(cap)``
    is a warn-once memo, and a test of it (``if cap not in _UNTUNED_ARCH_WARNED:``) refuses nothing."""
    if not _is_note(stmt):
        return False
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and not isinstance(stmt.value.func, ast.IfExp):
        return bool(_NOTE_CALL_RE.search(last_name(stmt.value.func) or ""))
    return True


def _logs_refusal(stmt):
    """A log call whose message says the path is turned off or refused (``_REFUSAL_LOG_RE``)."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value.args and _is_note(stmt)):
        return False
    if not _is_log(stmt):
        return False  # `errors.append("... required")`: an accumulator of reasons (``accumulate``), not a log
    return bool(_REFUSAL_LOG_RE.search(string_of(stmt.value.args[0]) or ""))


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
# Helpers that round a size up to a multiple (`round_up(hidden_size, 256)`): a padding, the layout a
# kernel needs, of a size the code already holds (issue 43, fix 9).
_ROUNDING_CALLS = frozenset(("round_up", "round_up_to", "round_up_to_multiple", "align", "align_up", "align_to",
                             "pad_to_multiple"))


def only_adjusts(body):
    """Does the body only adjust values the code already holds (``scale = scale * SM100_FIX``,
    ``num_warps = min(num_warps, 8)``, ``x += 1``, a size rounded up to a multiple:
    ``padded = round_up(size, 256)``, also under an ``if``/``else`` of its own), logging aside? Such
    a branch tunes what every GPU computes for the GPUs it admits; it is no path of its own (a call
    such as ``fused(x)`` or ``x.to(...)`` is: it does work)."""
    adjusted = False
    for stmt in body:
        if _is_note(stmt):
            continue
        if isinstance(stmt, ast.If) and only_adjusts(stmt.body) and (not stmt.orelse or only_adjusts(stmt.orelse)):
            adjusted = True
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], (ast.Name, ast.Attribute)) and _rounds_up(stmt.value):
            adjusted = True
            continue
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, (ast.Name, ast.Attribute)) \
                and _arithmetic(stmt.value):
            adjusted = True
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], (ast.Name, ast.Attribute)) and _arithmetic(stmt.value):
            target = dotted(stmt.targets[0])
            if target is not None and any(dotted(n) == target for n in walk(stmt.value)
                                          if isinstance(n, (ast.Name, ast.Attribute))):
                adjusted = True
                continue
        return False
    return adjusted


def _rounds_up(value):
    """``round_up(size, 256)``: a rounding helper (``_ROUNDING_CALLS``) over arithmetic arguments."""
    return isinstance(value, ast.Call) and last_name(value.func) in _ROUNDING_CALLS and len(value.args) >= 2 \
        and not value.keywords and all(_arithmetic(a) for a in value.args)


def _arithmetic(value):
    """No call but the arithmetic built-ins (``_ARITHMETIC_CALLS``): operators over values."""
    return all(dotted(node.func) in _ARITHMETIC_CALLS for node in walk(value) if isinstance(node, ast.Call))


def _only_selects(body):
    """The body only assigns values, calling nothing (``backend = "flashinfer_cutedsl"``, ``cfg = (1,
    None)``), between notes, also under an ``if``/``else`` of its own whose test calls nothing
    (``if Lq <= 256: BLOCK_M, BLOCK_N = (64, 64) else: BLOCK_M, BLOCK_N = (16, 64)``: sizes picked by
    the problem's shape; issue 43, fix 12), or only returns one (``return cuda_version >= (12, 4)``):
    a choice of a value, not work (``set_fa_ver(4)`` turns FA4 on; ``return make_runner()`` builds one)."""
    if body and isinstance(body[-1], ast.Return) and body[-1].value is not None \
            and all(_is_note(s) for s in body[:-1]):
        return not any(isinstance(n, ast.Call) for n in walk(body[-1].value))
    return _selects_block(body)


def _selects_block(body):
    """``_only_selects``' assignments: at least one, each calling nothing, between notes and nested
    ``if``/``else`` blocks of the same kind."""
    selected = False
    for stmt in body:
        if _is_note(stmt) and not isinstance(stmt, ast.Assign):
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and not any(isinstance(n, ast.Call) for n in walk(stmt)):
            selected = True
            continue
        if isinstance(stmt, ast.If) and not any(isinstance(n, ast.Call) for n in walk(stmt.test)) \
                and _selects_block(stmt.body) and (not stmt.orelse or _selects_block(stmt.orelse)):
            selected = True
            continue
        return False
    return selected


def _only_tunes(body):
    """The setter the body only hands literal settings to (``constraints = {"split_k": 1}`` then
    ``opt_flags.update_opt_flags_constraints(constraints)``), between notes, or None: one call whose
    arguments are literals or names the body bound to literals (issue 43, fix 10)."""
    bound, calls = set(), []
    for stmt in body:
        if _is_note(stmt):
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and literal(stmt.value) is not NO_VALUE and not calls:
            bound.add(stmt.targets[0].id)
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            calls.append(stmt.value)
            continue
        return None
    if len(calls) != 1:
        return None
    call = calls[0]
    values = list(call.args) + [k.value for k in call.keywords]
    if not all((isinstance(v, ast.Name) and v.id in bound) or literal(v) is not NO_VALUE for v in values) \
            or not values:
        return None
    return (dotted(call.func) or last_name(call.func) or "")[:TEXT_MAX] or None


def literal_choices(body):
    """The (setting, literal) pairs a block assigns anywhere in it, nested blocks included
    (``self.moe_runner_backend = "triton_kernel"``, ``overrides["moe_runner_backend"] = "marlin"``):
    the values it picks, by the name it stores them under."""
    found = set()
    for stmt in body:
        for node in walk(stmt):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target = node.targets[0]
            name = last_name(target) if isinstance(target, (ast.Name, ast.Attribute)) else _subscript_key(target)
            value = literal(node.value)
            if name and (value is None or isinstance(value, (str, int, float, bool))):
                found.add((name, value))
    return found


def generic_choices(head, names_a_gpu):
    """The (setting, literal) pairs the generic path of the if/elif chain that starts at ``head``
    assigns: its plain ``else``, and each branch whose own test names no GPU or platform
    (``names_a_gpu(test)`` false: ``elif self.ep_size == 1 and ...``), whatever is nested in
    them. A GPU's own branch that only picks one of these values picks what every GPU gets
    there (issue 43, fix 12)."""
    found = set()
    stmt = head
    while True:
        if not names_a_gpu(stmt.test):
            found |= literal_choices(stmt.body)
        if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If):
            stmt = stmt.orelse[0]
            continue
        found |= literal_choices(stmt.orelse)
        return found


def names_a_platform(test):
    """Does the test name a platform (``is_hip()``, ``get_platform().is_musa``) other than under a
    ``not``? Such a branch is that platform's path, not the generic one."""
    negated = set()
    for node in walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            negated.update(id(n) for n in walk(node.operand))
    return any(isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in negated
               and PLATFORM_NAME_RE.match(last_name(n) or "") for n in walk(test))


def _subscript_key(target):
    """The name a store into a dict writes (``overrides["attention_backend"]``), else None."""
    if not isinstance(target, ast.Subscript):
        return None
    index = target.slice.value if isinstance(target.slice, AST_INDEX) else target.slice
    key = literal(index)
    return key if isinstance(key, str) and IDENT_RE.match(key) else None


def body_effect(body, locator):
    effect = {}
    sets = []
    keys = []  # settings stored in a dict by name (`overrides["attention_backend"] = ...`), apart from `sets`
    for stmt in body:
        for node in walk(stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    name = last_name(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                    if name and name not in sets:
                        sets.append(name)
                    key = _subscript_key(target)
                    if key is not None and key not in keys:
                        keys.append(key)
            elif isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
                for key in node.value.keys:
                    if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value not in sets:
                        sets.append(key.value)
    if sets:
        effect["sets"] = sets[:20]
    if keys:
        effect["keys"] = keys[:20]
    if only_adjusts(body):
        effect["adjusts"] = True
    if _only_selects(body):
        effect["selects"] = True
    setter = _only_tunes(body)
    if setter is not None:
        effect["tunes"] = setter
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
