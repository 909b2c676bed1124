"""A branch this GPU fails that costs it nothing (issue 43), judged from the code (pure).

A branch whose test the GPU fails is ``blocked`` when the GPU loses what the branch does. It loses
nothing when the branch is written for GPUs other than it while its own path serves it:

- ``older``: the test admits only the oldest GPUs, up to a threshold below this GPU's capability
  (``if major < 9: LEGACY_CONFIG``, ``(8, 0) <= cap < (10, 0)``, ``is_sm80_before``): every GPU from
  the threshold up, this one among them, takes the other path;
- ``others``: the test only negates GPU tests (``not is_blackwell()``, ``major != 12``, ``x and not
  native_scale`` where ``native_scale`` names this GPU's family) that this GPU passes, and the
  statement has another branch (``else``, the other side of ``A if test else B``, or a sibling of
  its chain that admits the GPU): the one the named GPUs, this one among them, take;
  The same kind where the test admits a GPU of this GPU's own architecture but not this one, and
  GPUs of other architectures, and the statement has an ``else`` (``if get_device_sm() in (87, 110, 121): free = sysmem() else: free =
  mem_get_info()`` on sm120): the test picks devices by a property (memory shared with the CPU), not
  an architecture by what it runs; the GPUs it leaves out take the ``else``;
- ``own_branch``: a sibling of its if/elif chain written for GPUs other than the oldest admits this
  GPU (``elif major == 9: H100_CFG`` beside ``elif major >= 10: BLACKWELL_CFG``; an early-return
  sequence ``if cap[0] == 9: return "hopper"`` then ``if cap[0] >= 10: return ...`` is such a chain,
  the scanner marks it): it has a branch of its own. A sibling that admits the oldest GPUs too
  (``elif device_sm >= 80: fa3``) is the generic path every GPU falls to: this GPU loses the branch
  it fails; so is a sibling that only picks values the chain's generic path picks for any GPU
  (``elif is_sm120_supported(): backend = "triton_kernel"`` beside a later ``elif ep_size == 1:
  ... backend = "triton_kernel"``: the scanner's ``effect.generic``). A plain ``else`` is such a
  path too, unless an enclosing test took the oldest GPUs
  (``if arch in ("sm80", "sm86"): ... else: if arch == "sm90": SM90 else: NEWER``): then only GPUs
  newer than those reach it, and it is this GPU's own; so it is where a refusal earlier in the
  function stops the oldest GPUs and no GPU of an older generation than this one takes the ``else``
  (``if cap not in SUPPORTED: raise`` before ``if cap == (9, 0): ... elif cap == (10, 0): ... else:
  SM120_KERNEL``);
- ``quirk``: the body only adjusts a value every GPU computes (``scale = scale * SM100_FIX``,
  ``num_warps = min(num_warps, 8)``, a size padded ``round_up(size, 256)`` for that architecture's
  kernels: the scanner's ``effect.adjusts``), with no ``else``; or every branch of its chain (no
  ``else``), or a lone ``if``, only hands the same setter literal settings (``constraints = {"split_k": 1};
  opt_flags.update_opt_flags_constraints(constraints)``: ``effect.tunes``), a table of
  per-architecture settings where the GPU no branch names keeps the defaults; or the branch and
  its ``else`` only give the same names numbers (``if arch == "sm90": BLKQ, BLKK = 64, 128 else:
  BLKQ, BLKK = 128, 64``: ``effect.table``; a kernel chosen by name is no such row); or ``A if
  test else B`` only adds a suffix to an architecture list where B adds nothing (``'+PTX' if arch
  == '9.0' else ''``: ``effect.flag``): PTX beside the code that architecture gets anyway; or it
  picks a compiler math mode for one other generation only (``["--use_fast_math"] if arch == (9, 0)
  else []``, ``"fast_math" if use_fast_math else "precise_math"``, the ``use_fast_math = arch ==
  (9, 0)`` read only so, and ``if arch == (9, 0): return ["--use_fast_math"]`` before ``return []``:
  ``effect.math_mode``): that generation's build matched, this GPU builds the
  same kernel the way every other GPU does (other compiler options, ``-D`` macros, change the code
  compiled: not one);
- ``default``: the body only chooses a setting the test requires unset, ``is None`` (``if is_sm100()
  and backend is None: backend = "triton"``; in a dict of overrides too, ``overrides["attention_backend"]
  = "flashinfer"``): another GPU's default, this GPU keeps the one it gets. Against ``== "auto"`` (``if
  is_sm100() and moe_runner_backend == "auto": moe_runner_backend = "flashinfer_trtllm"``) it is not:
  "auto" asks the program for its best runner, and the branch is that choice made for other GPUs;
- ``imports``: the body only imports (``if is_sm90(): from flashinfer.gemm import gemm_sm90``) and
  another branch beside it whose test tells GPUs apart admits this GPU (its own kernels): what runs
  is decided where the names are used, each use a gate of its own. With no such branch the one it
  fails imports the module's only specialised kernel, and this GPU is left the generic one (blocked);
- ``taken_before``: an earlier branch of its chain admits this GPU (``if is_sm120_supported(): cudnn
  elif is_sm100_supported(): cutedsl``, ``elif major == 12 and minor == 1`` after ``(12, 0)``, the
  ``else: assert is_sm90()`` after ``if is_sm100() or is_sm120():``): the GPU never gets here, its
  own branch caught it (``context.Placer.taken_before``), whatever the earlier test's shape; read
  where the branch only selects a value (``return cuda_version >= (12, 4)`` too), also on a
  catalogued feature's path (the feature is decided by the branch that caught the GPU).

The reverse, where this GPU falls to the legacy or generic path, stays blocked: ``if is_sm90() or
is_sm100(): FAST`` (no threshold: the oldest GPUs do not pass), ``if 9 <= major < 12: NEW``, ``if
major < 12:`` on sm120 (the threshold is this GPU itself: written about it), ``if not is_sm120():
register()`` (no branch of its own), ``if is_sm100(): out = fused(out)`` (work, not an adjustment).

Only ``if`` branches (and the test of ``A if test else B``) are read so, and only those whose own
test stops the GPU. A value with no branch (``use_marlin = can_auto_enable_marlin_fp8()``, ``return
x and not is_blackwell()``) does not say what the GPU that gets False does instead, so it is read
only as ``older`` and only as a band: true from FLOOR up to a threshold below this GPU and for no
GPU older than FLOOR (``80 <= sm < 89``: a fallback for a few GPUs that lack what newer ones have,
fp8 hardware there). A value true for every GPU but some (``not is_blackwell()``, which sm75 passes
too) withholds something from those: blocked, unless it is a method's value that a sibling method
reads negated (``enable_dispatch_shared_one_stream_overlap`` returns ``is_sbo_enabled() and not
is_blackwell()``, ``enable_combine_shared_two_stream_overlap`` returns ``... and not
cls.enable_dispatch_shared_one_stream_overlap()``: the scanner's ``effect.alternative``): the two are
one choice, and the GPUs it names get the other side (``others``). A gate on a catalog feature's path is not read so:
there the question is whether the GPU gets that feature, and a branch it skips is the feature it
does not get.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from gpuops.gates.in_effect import unreachable
from gpuops.gates.logic import RECENT_CUDA, Evaluator, GpuTarget, PredicateBook, cap_verdicts, node_text
from gpuops.remote.gate_tree import children, clause_nodes
from gpuops.frozen import frozen

# The oldest architecture the ``older`` threshold counts from: a lower bound at Ampere
# (``(8, 0) <= cap < (10, 0)``) is SGLang's floor for a path, not a band of GPUs chosen over others.
FLOOR = (8, 0)
# GPUs older than FLOOR, asked when the test admits none of the candidates (``major < 8``).
_OLDER_THAN_FLOOR = ((7, 5), (7, 0), (6, 0))
KINDS = ("older", "others", "own_branch", "quirk", "default", "imports", "taken_before")
# What a test that requires a setting unset compares it with: `backend is None`. Not `== "auto"`: the
# program's own pick of the best runner, which a branch for sm100 makes there (issue 43, fix 13a).
_UNSET = (None,)


@frozen
class Skip:
    """Why the GPU that fails a branch's test loses nothing by it."""

    kind: str  # one of KINDS
    reason: str


def skipped_branch(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget,
                   own_branch: Mapping[str, Any] | None = None,
                   neighbours: Sequence[Mapping[str, Any]] = (),
                   taken_before: Mapping[str, Any] | None = None) -> Skip | None:
    """Why ``gpu``, which fails this branch's own test, loses nothing by it, or None (it does, or
    the code does not say). ``own_branch``: a sibling of its if/elif chain whose test admits the GPU
    (``context.Placer.sibling``); ``neighbours``: the gates of its function (its enclosing tests);
    ``taken_before``: the earlier branch of its chain that admits the GPU and so keeps it from here
    (``context.Placer.taken_before``)."""
    if int(gate.get("polarity", 1)) < 0:
        return None
    if taken_before is not None:
        return Skip("taken_before", f"never reached on {gpu.sm}: the earlier branch "
                                    f"{taken_before.get('file')}:{taken_before.get('line')} "
                                    f"(`{taken_before.get('text')}`) of its chain takes it")
    if gate.get("kind") == "assign" and (gate.get("effect") or {}).get("math_mode"):
        return _older(gate, book, gpu, band=True) or _math_mode(gate, book, gpu)
    if gate.get("kind") in ("assign", "return"):
        # a value: no branch of the GPU's to read, unless a sibling method reads it negated
        return _older(gate, book, gpu, band=True) or _negated_value(gate, book, gpu)
    statement = gate.get("kind") == "if"
    conditional = gate.get("kind") == "expr" and gate.get("orelse") == "else"  # `A if test else B`
    if not (statement or conditional):
        return None
    found = _older(gate, book, gpu) or _negated(gate, book, gpu, own_branch) or _device_property(gate, book, gpu)
    if found is None and conditional:
        found = _flag(gate, gpu) or _math_mode(gate, book, gpu)
    if found is None and statement:
        found = (_own_branch(gpu, book, own_branch) or _newer_else(gate, book, gpu, neighbours)
                 or _guarded_else(gate, book, gpu, neighbours) or _quirk(gate, gpu) or _tunes(gate, gpu, neighbours)
                 or _math_mode(gate, book, gpu) or _table(gate, gpu) or _default(gate, gpu)
                 or _imports(gpu, book, gate, neighbours))
    return found


def _candidates(book: PredicateBook) -> list[tuple[int, int]]:
    """The (major, minor) capabilities the predicates name, from FLOOR up, oldest first."""
    return sorted({(major, minor) for _, major, minor in book.candidates if (major, minor) >= FLOOR})


def _admitted(gate: Mapping[str, Any], book: PredicateBook, ordered: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """Those of ``ordered`` the gate's test admits (oldest first); None when it is unknown for any."""
    verdicts = cap_verdicts(gate, book, [GpuTarget(m, n, RECENT_CUDA) for m, n in ordered])
    if any(v.status == "unknown" for v in verdicts):
        return None
    return [cc for cc, v in zip(ordered, verdicts) if v.status == "open"]


def _older(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget, band: bool = False) -> Skip | None:
    """The test admits the oldest GPUs up to a threshold below ``gpu``, and no GPU from there up.
    ``band``: from FLOOR up, and no GPU older than FLOOR (a value's test must have both ends)."""
    ordered = _candidates(book)
    passing = _admitted(gate, book, ordered)
    if passing is None:
        return None
    if passing != ordered[:len(passing)] or len(passing) == len(ordered):
        return None  # a band that leaves out the oldest GPUs (`is_sm90()`), or every GPU
    if band:
        below = cap_verdicts(gate, book, [GpuTarget(m, n, RECENT_CUDA) for m, n in _OLDER_THAN_FLOOR])
        if not passing or any(v.status != "blocked" for v in below):
            return None  # `not is_blackwell()`: every GPU but those, the oldest too: withheld from them
    elif not passing:
        older = cap_verdicts(gate, book, [GpuTarget(m, n, RECENT_CUDA) for m, n in _OLDER_THAN_FLOOR])
        if all(v.status != "open" for v in older):
            return None  # it admits no GPU at all: nothing older is served by it
    threshold = ordered[len(passing)]
    if threshold >= (gpu.major, gpu.minor):
        return None  # `major < 12` on sm120: the test was written about this GPU, not older ones
    return Skip("older", f"a path for GPUs older than {_sm(threshold)} only; {gpu.sm} takes the path of "
                         f"{_sm(threshold)} and newer")


def _negated(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget,
             own_branch: Mapping[str, Any] | None) -> Skip | None:
    """Every GPU test of the condition is negated (``not P``, ``!=``, ``not in``), one of them names
    ``gpu`` (it passes P), and the statement has another branch: P's, this GPU's."""
    if not (own_branch is not None or gate.get("orelse") == "else"):
        return None
    tests = list(_gpu_tests(gate.get("condition") or {}, negated=False))
    if not tests or not all(negated for _, negated in tests):
        return None
    evaluator = Evaluator(book, gpu)
    for node, _ in tests:
        inverse = (node.get("atom") or {}).get("cmp") in ("!=", "not in")
        if evaluator.eval(node) is (not inverse):  # `is_blackwell()` true, `major != 12` false on sm120
            return Skip("others", f"a path for the GPUs other than those `{node_text(node)}` "
                                  f"{'excludes' if inverse else 'names'}, {gpu.sm} among them; it takes "
                                  "the statement's other branch")
    return None


def _device_property(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget) -> Skip | None:
    """The test admits a GPU of ``gpu``'s own architecture but not ``gpu``, and GPUs of other
    architectures too (``get_device_sm() in (87, 110, 121)``: sm121 and not sm120, and Orin and Thor),
    and the statement has an ``else``: it tells apart GPUs that run the same code across generations,
    so what it names is a property of those devices (memory shared with the CPU), not a path of an
    architecture; the GPUs it leaves out, this one among them, take the ``else``. A test of the one
    sibling alone (``3 if is_sm121() else 4`` stages, for sm121's shared memory per block, which
    sm120 has too: 0.5.22 inkling_moe.py:975, labelled blocked) may be about the chip sm120 shares."""
    if gate.get("orelse") != "else":
        return None
    admitted = _admitted(gate, book, _candidates(book))
    if admitted is None:
        return None
    siblings = [cc for cc in admitted if cc[0] == gpu.major and cc != (gpu.major, gpu.minor)]
    if not siblings or (gpu.major, gpu.minor) in admitted or len({major for major, _ in admitted}) < 2:
        return None
    return Skip("others", f"a path for devices the test picks out, {_sm(siblings[0])} of {gpu.sm}'s own "
                          f"architecture among them ({', '.join(_sm(cc) for cc in admitted)}); {gpu.sm} takes the "
                          "`else`, as the GPUs it leaves out do")


def _negated_value(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget) -> Skip | None:
    """A method's value whose GPU tests are all negated, one of them naming ``gpu`` (``is_sbo_enabled()
    and not is_blackwell()``), and which a sibling method reads negated (the scanner's
    ``effect.alternative``: ``... and not cls.enable_dispatch_shared_one_stream_overlap()``): the GPUs
    it names get that sibling's side of the choice."""
    alternative = (gate.get("effect") or {}).get("alternative")
    if not alternative:
        return None
    found = _negated({**gate, "orelse": "else"}, book, gpu, None)
    if found is None:
        return None
    return Skip("others", f"{found.reason.split('; it takes')[0]}; it gets `{alternative}`, the other side of "
                          "the choice, which reads this value negated")


def _gpu_tests(node: Mapping[str, Any], negated: bool) -> Iterator[tuple[Mapping[str, Any], bool]]:
    """The GPU tests (``cap`` atoms) under ``node``, each with whether it is read negated (under an
    odd number of ``not``, or written ``!=`` / ``not in``)."""
    op = node.get("op")
    if op == "cap":
        inverse = (node.get("atom") or {}).get("cmp") in ("!=", "not in")
        yield node, negated != inverse
    elif op == "not":
        yield from _gpu_tests(node.get("arg") or {}, not negated)
    elif op in ("and", "or", "alias"):
        for child in children(node):
            yield from _gpu_tests(child, negated)


def _own_branch(gpu: GpuTarget, book: PredicateBook, own_branch: Mapping[str, Any] | None) -> Skip | None:
    """A sibling of the chain admits ``gpu`` and is not the generic path: it leaves out the oldest GPUs."""
    if own_branch is None:
        return None
    (oldest,) = cap_verdicts(own_branch, book, [GpuTarget(FLOOR[0], FLOOR[1], RECENT_CUDA)])
    if oldest.status != "blocked":
        return None  # `elif device_sm >= 80:`: the path every GPU falls to, not one of this GPU's own
    if (own_branch.get("effect") or {}).get("generic"):
        return None  # it only picks what the chain's generic path picks for any GPU: not a path of its own
    return Skip("own_branch", f"a branch for other GPUs; {gpu.sm} takes its own branch at "
                              f"{own_branch.get('file')}:{own_branch.get('line')} (`{own_branch.get('text')}`)")


def _newer_else(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget,
                neighbours: Sequence[Mapping[str, Any]]) -> Skip | None:
    """The ``else`` of the statement, which ``gpu`` takes, is reached by no GPU older than a
    threshold above FLOOR: an enclosing test took those (``if arch in ("sm80", "sm86"): ...
    else:`` around it), and every GPU from the threshold up reaches it."""
    if gate.get("orelse") != "else" or not gate.get("within") or unreachable(gate, neighbours, book, gpu):
        return None
    ordered = _candidates(book)
    reached = [not unreachable(gate, neighbours, book, GpuTarget(m, n, RECENT_CUDA)) for m, n in ordered]
    first = reached.index(True) if True in reached else 0
    if first == 0 or not all(reached[first:]):
        return None  # the oldest GPUs reach it too (the else is their path), or a band of others does not
    return Skip("own_branch", f"a branch for other GPUs; {gpu.sm} takes its `else`, which GPUs older than "
                              f"{_sm(ordered[first])} never reach (an enclosing test takes them)")


def _guarded_else(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget,
                  neighbours: Sequence[Mapping[str, Any]]) -> Skip | None:
    """The ``else`` of the statement, which ``gpu`` takes, is taken by no GPU of an older generation:
    a refusal earlier in the function stops every GPU but a few (``if cap not in SUPPORTED: raise``
    before ``if cap == (9, 0): SM90 elif cap == (10, 0): SM100 else: SM120``), and the chain's tests
    take the others. The ``else`` is then the path of this GPU's generation, not the generic one."""
    if gate.get("orelse") != "else" or not _refused_before(gate, neighbours, book, GpuTarget(FLOOR[0], FLOOR[1],
                                                                                              RECENT_CUDA)):
        return None
    if unreachable(gate, neighbours, book, gpu) or _refused_before(gate, neighbours, book, gpu):
        return None
    ordered = _candidates(book)
    takers = []
    for major, minor in ordered:
        target = GpuTarget(major, minor, RECENT_CUDA)
        if unreachable(gate, neighbours, book, target) or _refused_before(gate, neighbours, book, target):
            continue
        (own,) = cap_verdicts(gate, book, [target])
        if own.status == "unknown":
            return None
        if own.status == "blocked":
            takers.append((major, minor))
    if not takers or any(major < gpu.major for major, _ in takers):
        return None  # an older generation takes the else too: the generic path
    return Skip("own_branch", f"a branch for other GPUs; {gpu.sm} takes its `else`, which only "
                              f"{', '.join(_sm(cc) for cc in takers)} reach (a refusal before it stops the others)")


def _refused_before(gate: Mapping[str, Any], neighbours: Sequence[Mapping[str, Any]], book: PredicateBook,
                    gpu: GpuTarget) -> bool:
    """A guard earlier in the function, in the gate's block or one around it, that ends the path
    (raise, exit) refuses ``gpu``."""
    within = list(gate.get("within") or ())
    for other in neighbours:
        if other.get("kind") != "guard" or int(other.get("line", 0)) >= int(gate.get("line", 0)):
            continue
        if (other.get("effect") or {}).get("shape") not in ("raise", "exit"):
            continue
        around = list(other.get("within") or ())
        if around != within[:len(around)]:
            continue  # in another block: not on the way to the gate
        (verdict,) = cap_verdicts(other, book, [gpu])
        if verdict.status == "blocked":
            return True
    return False


def _quirk(gate: Mapping[str, Any], gpu: GpuTarget) -> Skip | None:
    """The body only adjusts values every GPU computes, for the GPUs the test admits; no ``else``."""
    effect = gate.get("effect") or {}
    if not effect.get("adjusts") or gate.get("orelse") == "else":
        return None
    what = ", ".join(str(s) for s in effect.get("sets") or ()) or "a value"
    return Skip("quirk", f"only adjusts {what} for the GPUs it admits; {gpu.sm} keeps the value every "
                         "other GPU computes")


def _tunes(gate: Mapping[str, Any], gpu: GpuTarget, neighbours: Sequence[Mapping[str, Any]]) -> Skip | None:
    """Every branch of the chain, or the lone ``if``, only hands the same setter literal settings (the
    scanner's ``effect.tunes``: ``constraints = {"split_k": 1}; opt_flags.update_opt_flags_constraints(
    constraints)`` for sm90, other constraints for sm100), and no ``else``: a table of per-architecture
    settings; the GPU no branch names keeps the setter's defaults."""
    setter = (gate.get("effect") or {}).get("tunes")
    if not setter or gate.get("orelse") == "else":
        return None
    # A lone `if` (no chain) is a table of one row (0.5.6 mxfp4.py:105, sm100's row of 0.5.9's chain):
    # the GPUs it does not admit keep the setter's defaults all the same (issue 43, fix 13b).
    chain = [g for g in neighbours if gate.get("chain") is not None and g.get("chain") == gate.get("chain")]
    if any(g.get("orelse") == "else" or (g.get("effect") or {}).get("tunes") != setter for g in chain):
        return None
    return Skip("quirk", f"only hands `{setter}` settings of its own for the GPUs it admits, as each branch of "
                         f"its chain does; {gpu.sm} keeps the settings every other GPU gets")


def _table(gate: Mapping[str, Any], gpu: GpuTarget) -> Skip | None:
    """The branch and its ``else`` only give the same names literal values (the scanner's
    ``effect.table``): per-architecture settings, the ``else`` those of every other GPU."""
    if not (gate.get("effect") or {}).get("table") or gate.get("orelse") != "else":
        return None
    return Skip("quirk", f"only picks literal settings of its own for the GPUs it admits; {gpu.sm} gets the "
                         "settings of the `else`, as every other GPU does")


def _flag(gate: Mapping[str, Any], gpu: GpuTarget) -> Skip | None:
    """``SUFFIX if test else ""``: only a suffix of the architecture list for the GPUs the test admits
    (the scanner's ``effect.flag``); the code built for each GPU is the same."""
    flag = (gate.get("effect") or {}).get("flag")
    if not flag:
        return None
    return Skip("quirk", f"only adds `{flag}` to the architecture list for the GPUs it admits; {gpu.sm} gets "
                         "the same code built without it")


def _math_mode(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget) -> Skip | None:
    """The test picks a compiler math mode (the scanner's ``effect.math_mode``) for the GPUs of one
    generation other than ``gpu``'s only (``arch == (9, 0)``): a match of that generation's build."""
    mode = (gate.get("effect") or {}).get("math_mode")
    if not mode:
        return None
    admitted = _admitted(gate, book, _candidates(book))
    if admitted is None:
        return None
    if len({major for major, _ in admitted}) != 1 or admitted[0][0] == gpu.major:
        return None  # several generations, or this GPU's own: not one other architecture's quirk
    return Skip("quirk", f"only picks the compiler math mode `{mode}` for {', '.join(_sm(cc) for cc in admitted)}; {gpu.sm} "
                         "builds the same kernel the way every other GPU does")


def _default(gate: Mapping[str, Any], gpu: GpuTarget) -> Skip | None:
    """The body only sets what the test requires unset (``backend is None``), in attributes or in a
    dict of overrides (``overrides["attention_backend"] = "flashinfer"``, the scanner's ``effect.keys``).
    Against ``== "auto"`` it is a loss: every such branch of the samples sets sm100's MoE or GEMM runner
    where the program picks the best one, and the blind readers call it so whether it is stored in an
    attribute (0.5.6 server_args.py:1148, 0.5.7 :1260, 0.5.8 :1367) or in the overrides dict (0.5.22
    deepseek_v4.py:30; 0.5.23 llama4.py:38, mimo_v2.py:34/50, minimax_m2.py:24)."""
    tree = gate.get("condition") or {}
    effect = gate.get("effect") or {}
    sets, keys = set(effect.get("sets") or ()), set(effect.get("keys") or ())
    unset = {str(c.get("ref") or "").split(".")[-1]: c["value"] for c in clause_nodes(tree)
             if c.get("cmp") in ("is", "==") and "value" in c and c["value"] in _UNSET}
    if tree.get("op") != "and" or not (sets or keys) or not (sets | keys) <= set(unset) \
            or gate.get("orelse") == "else":
        return None
    names = ", ".join(sorted(sets | keys))
    return Skip("default", f"chooses {names} for the GPUs it admits only where none was given; {gpu.sm} "
                           "keeps the one it gets otherwise")


def _imports(gpu: GpuTarget, book: PredicateBook, gate: Mapping[str, Any],
             neighbours: Sequence[Mapping[str, Any]]) -> Skip | None:
    """The body only imports, and another branch beside it (same file, same function: module level
    for most) whose test tells GPUs apart admits ``gpu``: this GPU brings in code of its own there, the
    branch it fails imports another architecture's (``if is_sm90_supported(): import
    fp8_blockscale_gemm_sm90`` beside ``if is_blackwell_supported(): import mm_mxfp8; def
    flashinfer_bmm_fp8(...)``, 0.5.14 fp8_utils.py:389 and :243). Where none does (``if
    ENABLE_FLASHINFER_GEMM: import gemm_fp8_nt_groupwise``, the flag sm100's test alone) the branch
    imports the only specialised kernel of the module and this GPU is left the generic one: a loss
    (issue 43, fix 15; 0.5.2 fp8_utils.py:136, labelled blocked)."""
    if not (gate.get("effect") or {}).get("imports"):
        return None
    ordered = [GpuTarget(m, n, RECENT_CUDA) for m, n in sorted({(major, minor) for _, major, minor in book.candidates
                                                                 if (major, minor) >= FLOOR})]
    own = [n for n in neighbours
           if n.get("id") != gate.get("id") and n.get("kind") == "if" and int(n.get("polarity", 1)) >= 0
           and cap_verdicts(n, book, [gpu])[0].status == "open"
           # a test that tells GPUs apart (not `if _is_cuda:`, which every NVIDIA GPU passes)
           and any(v.status == "blocked" for v in cap_verdicts(n, book, ordered))]
    if not own:
        return None
    return Skip("imports", f"only imports names for the GPUs it admits; {gpu.sm} imports its own beside it "
                           f"(line {own[0].get('line')}), and what runs is decided where they are used")


def _sm(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


__all__ = ["FLOOR", "KINDS", "Skip", "skipped_branch"]
