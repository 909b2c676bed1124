"""Three-valued evaluation of a scanned gate condition against a GPU (and optionally a server).

A condition tree (written by the scanner, ``gpuops/remote/scan_tree.py``; its shape is in
``gpuops/remote/gate_tree.py``) is and/or/not over:
``cap`` atoms (a predicate, a capability comparison, a CUDA-version comparison), ``platform`` atoms
(``is_cuda()`` is true on an NVIDIA host, ``is_hip()`` false), ``alias`` nodes (a module or local
name that stands for a condition, expanded) and opaque ``clause`` leaves (``self.tp_size > 1``).
Each evaluates to True, False or None (not known); ``and``/``or``/``not`` follow Kleene's logic, so
a gate whose GPU test is False is closed whatever its other clauses say.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

# The GPU a gate is judged for has its own module; its names are imported from here too.
from gpuops.gates.gpu_target import GpuTarget, make_gpu, parse_capability, parse_cuda  # noqa: F401
from gpuops.gates.predicates import PLATFORM_FALLBACK, Meaning, check, fallback_meaning, meaning_from_entry
from gpuops.gates.scan import GateScan
# The tree's walks are written once, in the host module that builds the tree (the scanner's
# bundle carries it to hosts); ``is_pure_cap`` is its ``only_atoms`` under this package's name.
from gpuops.remote.gate_tree import clause_nodes
from gpuops.remote.gate_tree import only_atoms as is_pure_cap
from gpuops.frozen import frozen

Tri = "bool | None"

# Capabilities a gate's ``admits`` list is computed over (name, major, minor), at least: every
# architecture the release's own definitions name is added (``PredicateBook.candidates``).
CANDIDATES: tuple[tuple[str, int, int], ...] = (
    ("sm80", 8, 0), ("sm86", 8, 6), ("sm89", 8, 9), ("sm90", 9, 0), ("sm100", 10, 0),
    ("sm103", 10, 3), ("sm110", 11, 0), ("sm120", 12, 0), ("sm121", 12, 1),
)
_MAJORS = range(7, 14)  # what a capability's major can plausibly be (Volta .. beyond Blackwell)
# A CUDA runtime recent enough for every predicate: ``admits`` is about the GPU, not the toolkit.
RECENT_CUDA = (13, 0)
_TRUE_PLATFORMS = {"cuda", "cuda_alike"}


class PredicateBook:
    """The scan's predicate definitions, looked up as the scanner resolved them."""

    def __init__(self, scan: GateScan) -> None:
        self._by_key: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._by_name: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for entry in scan.predicates:
            self._by_key[(str(entry.get("file")), str(entry.get("name")))] = entry
            self._by_name[str(entry.get("name"))].append(entry)
        self.platform_attrs = dict(scan.platform_attrs) or dict(PLATFORM_FALLBACK)
        self.candidates = _candidates(scan)

    def entry(self, name: str, file: str | None) -> Mapping[str, Any] | None:
        if file is not None and (file, name) in self._by_key:
            return self._by_key[(file, name)]
        entries = self._by_name.get(name) or []
        preferred = [e for e in entries if str(e.get("file", "")).startswith("srt/utils")]
        chosen = preferred or entries
        return chosen[0] if chosen else None

    def names_meaning(self, meaning_test: Callable[[Meaning], bool]) -> list[str]:
        """Predicate names whose scanned meaning passes ``meaning_test`` (e.g. "exactly SM12x")."""
        found = []
        for name, entries in self._by_name.items():
            for entry in entries:
                meaning = meaning_from_entry(dict(entry))
                if meaning is not None and meaning_test(meaning):
                    found.append(name)
                    break
        return sorted(found)


def _candidates(scan: GateScan) -> tuple[tuple[str, int, int], ...]:
    """CANDIDATES plus every (major, minor) the release's gates and definitions name: ``== 107``,
    ``(10, 3)``, ``"sm121"``, a predicate of majors [11]."""
    found: set[tuple[int, int]] = {(a, b) for _, a, b in CANDIDATES}

    def add(value: Any, subject: str | None) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, list):
            if subject == "cc" and len(value) == 2 and all(isinstance(v, int) for v in value):
                add_cc(value[0], value[1])
                return
            for item in value:
                add(item, subject)
        elif isinstance(value, int):
            if subject == "sm":
                add_cc(*divmod(value, 10))
            elif subject == "major":
                add_cc(value, 0)
        elif isinstance(value, str) and subject and subject.startswith("fmt:"):
            match = re.search(r"(\d{2,3})", value)
            if match:
                add_cc(*divmod(int(match.group(1)), 10))

    def add_cc(major: int, minor: int) -> None:
        # (9, 4) and (9, 5) are what ROCm reports for MI300/MI350: no NVIDIA GPU is 9.x but 9.0.
        if major in _MAJORS and 0 <= minor <= 9 and not (major == 9 and minor):
            found.add((major, minor))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            atom = node.get("atom")
            if node.get("op") == "cap" and isinstance(atom, dict) and atom.get("kind") == "cc":
                add(atom.get("value"), str(atom.get("subject")))
            for value in node.values():
                if isinstance(value, (dict, list)):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for gate in scan.gates:
        walk(gate.get("condition"))
    for entry in scan.predicates:
        for major in entry.get("majors") or ():
            if isinstance(major, int):
                add_cc(major, 0)
        walk(entry.get("expr"))
    return tuple((f"sm{a}{b}", a, b) for a, b in sorted(found))


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge,
    "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
}

# Clause references that name a server setting under another name.
_ARG_ALIASES = {
    "is_dp_attention_enabled": "enable_dp_attention",
    "attn_dp_enabled_of": "enable_dp_attention",
    "model_arch": "architecture",
    "architectures": "architecture",
    "arch": "architecture",
}


def server_key(ref: str) -> str | None:
    """``self.tp_size`` -> tp_size; ``get_exec().comm.x`` -> x; ``hf_config.architectures[0]`` ->
    architecture; ``is_dp_attention_enabled()`` -> enable_dp_attention."""
    ref = re.sub(r"\((\.\.\.)?\)$", "", ref.replace("(...)", "()"))
    last = ref.split(".")[-1]
    last = re.sub(r"\[[^\]]*\]$", "", last)
    last = re.sub(r"\(\)$", "", last)
    if not re.fullmatch(r"[A-Za-z_]\w*", last):
        return None
    return _ARG_ALIASES.get(last, last)


# Short flag spellings SGLang accepts for the settings gates test (the command line may use either).
_FLAG_SPELLINGS = {"tp": "tp_size", "tensor_parallel_size": "tp_size", "dp": "dp_size",
                   "data_parallel_size": "dp_size", "ep": "ep_size", "expert_parallel_size": "ep_size",
                   "pp": "pp_size", "pipeline_parallel_size": "pp_size"}


def normalise_args(args: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Flag names as ServerArgs fields (``--tp`` -> tp_size), over ``defaults`` for flags not given."""
    out: dict[str, Any] = dict(defaults or {})
    for key, value in (args or {}).items():
        name = str(key).lstrip("-").replace("-", "_")
        out[_FLAG_SPELLINGS.get(name, name)] = value
    return out


def _coerce(actual: Any, like: Any) -> Any:
    """A command-line string read as the type the source compares it with ("8" vs 1 -> 8)."""
    if not isinstance(actual, str) or isinstance(like, str):
        return actual
    text = actual.strip().lower()
    if isinstance(like, bool) or like is None:
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no", "none", ""):
            return False if isinstance(like, bool) else None
        return actual
    if isinstance(like, (int, float)):
        try:
            return type(like)(float(text)) if isinstance(like, float) else int(text)
        except ValueError:
            return actual
    return actual


class Evaluator:
    """Evaluates trees for one GPU. ``unknown_cap`` replaces every not-known capability atom (to ask
    "could it matter?"); ``overrides`` forces nodes, by span, to a value (the patch planner's what-if)."""

    def __init__(
        self,
        book: PredicateBook,
        gpu: GpuTarget | None,
        server: Mapping[str, Any] | None = None,
        unknown_cap: bool | None = None,
        overrides: Mapping[tuple[Any, ...], bool] | None = None,
    ) -> None:
        self.book = book
        self.gpu = gpu
        self.args = normalise_args((server or {}).get("args"), (server or {}).get("defaults")) if server else None
        self.architecture = (server or {}).get("architecture") if server else None
        self.unknown_cap = unknown_cap
        self.overrides = dict(overrides or {})
        self.unknowns: list[str] = []
        self._defining: list[tuple[str, str]] = []  # the predicates being expanded: (name, file)

    def _note(self, why: str) -> None:
        if why not in self.unknowns:
            self.unknowns.append(why)

    def eval(self, node: Mapping[str, Any], depth: int = 0) -> bool | None:
        span = node.get("span")
        if span is not None and tuple(span) in self.overrides:
            return self.overrides[tuple(span)]
        if depth > 60:
            return None
        op = node.get("op")
        if op == "and":
            values = [self.eval(a, depth + 1) for a in node["args"]]
            if any(v is False for v in values):
                return False
            return True if all(v is True for v in values) else None
        if op == "or":
            values = [self.eval(a, depth + 1) for a in node["args"]]
            if any(v is True for v in values):
                return True
            return False if all(v is False for v in values) else None
        if op == "not":
            value = self.eval(node["arg"], depth + 1)
            return None if value is None else not value
        if op == "alias":
            return self.eval(node["expr"], depth + 1)
        if op == "platform":
            return node.get("name") in _TRUE_PLATFORMS
        if op == "cap":
            noted = len(self.unknowns)
            value = self.atom(node["atom"], depth)
            if len(self.unknowns) > noted and node.get("text"):
                # Say which atom: "`capability >= min_capability`: compared with a value ...".
                self.unknowns[noted:] = [f"`{node['text']}`: {why}" for why in self.unknowns[noted:]]
            if value is None and self.unknown_cap is not None:
                return self.unknown_cap
            return value
        if op == "clause":
            if self._defining:
                name, file = self._defining[-1]
                if node.get("argument") and span is not None:
                    # A test of what the caller passes (`dtype in (...)`): an ordinary clause of
                    # the call, its value enumerated like the gate's own (``definition_clauses``).
                    return self.overrides.get(argument_key(file, span))
                # Part of a predicate's definition gpuops cannot read: the predicate is not known,
                # never an ordinary (non-GPU) clause.
                if self.unknown_cap is not None:
                    return self.unknown_cap
                self._note(f"cannot read `{node_text(node)}` in the definition of {name}")
                return None
            return self.clause(node)
        return None

    # -- capability atoms

    def atom(self, atom: Mapping[str, Any], depth: int) -> bool | None:
        kind = atom.get("kind")
        gpu = self.gpu
        if gpu is None:
            self._note("the GPU's compute capability is not known")
            return None
        if kind == "pred":
            return self.predicate(str(atom.get("name")), atom.get("def"), depth, atom.get("attr"))
        if kind == "cc":
            return self.compare_capability(atom)
        if kind == "cuda":
            value = atom.get("value")
            fn = _CMP.get(str(atom.get("cmp")))
            if gpu.cuda is None:
                self._note("the CUDA version is not known")
                return None
            major = atom.get("subject") == "major"  # `cuda_major < 13`: CUDA 12.8 is 12 there, not (12, 8)
            if not isinstance(value, list) or fn is None or (major and len(value) != 1):
                self._note("a CUDA version comparison gpuops cannot read")
                return None
            if major:
                return bool(fn(gpu.cuda[0], value[0]))
            try:
                return bool(fn(gpu.cuda, tuple(value)))
            except TypeError:
                return None
        return None

    def predicate(self, name: str, file: str | None, depth: int, attr: str | None = None) -> bool | None:
        gpu = self.gpu
        assert gpu is not None
        entry = self.book.entry(name, file) if (file or attr is None) else self.book.entry(name, None)
        if entry is not None and depth < 40:
            if "majors" in entry:
                meaning = meaning_from_entry(dict(entry))
                if meaning is not None:
                    return self._checked(meaning, name)
            if "same_as" in entry:
                return self.predicate(str(entry["same_as"]), entry.get("file"), depth + 1)
            if "expr" in entry and isinstance(entry["expr"], dict):
                self._defining.append((name, str(entry.get("file"))))
                try:
                    return self.eval(entry["expr"], depth + 1)
                finally:
                    self._defining.pop()
        meaning = fallback_meaning(name) or (fallback_meaning(attr) if attr else None)
        if meaning is None:
            self._note(f"what {name} means is not known")
            return None
        return self._checked(meaning, name)

    def _checked(self, meaning: Meaning, name: str) -> bool | None:
        gpu = self.gpu
        assert gpu is not None
        value = check(meaning, gpu.major, gpu.minor, gpu.cuda)
        if value is None:
            self._note(f"{name} also needs CUDA >= {meaning.min_cuda[0]}.{meaning.min_cuda[1]} and the CUDA version is not known"
                       if meaning.min_cuda else f"{name}: not known")
        return value

    def compare_capability(self, atom: Mapping[str, Any]) -> bool | None:
        gpu = self.gpu
        assert gpu is not None
        subject = atom.get("subject")
        subject_value: Any = {
            "cc": (gpu.major, gpu.minor),
            "major": gpu.major,
            "minor": gpu.minor,
            "sm": gpu.major * 10 + gpu.minor,
        }.get(str(subject))
        if isinstance(subject, str) and subject.startswith("fmt:"):
            # A string formatted from the capability (f"sm{major}{minor}") compared with "sm90".
            try:
                subject_value = subject[4:].format(major=gpu.major, minor=gpu.minor, sm=gpu.major * 10 + gpu.minor)
            except (KeyError, IndexError, ValueError):
                subject_value = None
        fn = _CMP.get(str(atom.get("cmp")))
        value = _tuples(atom.get("value"))
        if value is None and atom.get("any_of") and subject_value is not None and fn is not None:
            # A constant method or parameter with several values (one per class or call site):
            # decided only where every one of them gives the same answer.
            try:
                answers = {bool(fn(subject_value, _tuples(v))) for v in atom["any_of"]}
            except TypeError:
                answers = set()
            if len(answers) == 1:
                return answers.pop()
            self._note(f"compared with one of {', '.join(map(str, atom['any_of']))}, which depends on "
                       "what runs (a class or a caller chosen at run time)")
            return None
        if subject_value is None or fn is None or value is None:
            self._note("a compute-capability comparison against a value gpuops cannot read")
            return None
        try:
            return bool(fn(subject_value, value))
        except TypeError:
            self._note("a compute-capability comparison gpuops cannot read")
            return None

    # -- clauses (only with a server)

    def clause(self, node: Mapping[str, Any]) -> bool | None:
        if self.args is None or "ref" not in node:
            return None
        key = server_key(str(node["ref"]))
        if key is None:
            return None
        if key == "architecture":
            actual = self.architecture
            if actual is None:
                return None
        elif key in self.args:
            actual = self.args[key]
        else:
            return None
        cmp = node.get("cmp")
        if cmp is None:
            return bool(_coerce(actual, True))
        if "value" not in node:
            return None
        expected = node["value"]
        if isinstance(expected, list):
            actual = _coerce(actual, expected[0] if expected else "")
        else:
            actual = _coerce(actual, expected)
        if cmp == "is":
            return actual is expected if expected is None else None
        if cmp == "is not":
            return actual is not expected if expected is None else None
        fn = _CMP.get(str(cmp))
        if fn is None:
            return None
        try:
            return bool(fn(actual, expected))
        except TypeError:
            return None


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples the source compared against: [9, 0] -> (9, 0)."""
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value) and len(value) == 2:
            return tuple(value)
        return [_tuples(v) for v in value]
    return value


def admitted(gate: Mapping[str, Any], ev: Evaluator) -> bool | None:
    """Does the gate let execution through (its condition, or the negation for a guard)?"""
    value = ev.eval(gate["condition"])
    if int(gate.get("polarity", 1)) < 0:
        value = None if value is None else not value
    for needed in gate.get("requires") or ():
        # A capability the statement cannot get past (a table lookup keyed by it) whatever the test.
        got = ev.eval(needed)
        if got is False:
            return False
        if got is None and value is not False:
            value = None
    return value


def admits(gate: Mapping[str, Any], book: PredicateBook) -> list[str]:
    """The capabilities this gate can let through, whatever its other clauses: those it does not
    block (``cap_verdict``). A capability an unreadable atom leaves undecided is listed too (the
    gate's status says it is unknown), so ``[]`` means that truly no GPU passes."""
    gpus = [GpuTarget(major, minor, RECENT_CUDA) for _, major, minor in book.candidates]
    return [name for (name, _, _), v in zip(book.candidates, cap_verdicts(gate, book, gpus)) if v.status != "blocked"]


def undecided(gate: Mapping[str, Any], book: PredicateBook) -> list[str]:
    """The capabilities whose verdict an unreadable capability atom leaves open."""
    gpus = [GpuTarget(major, minor, RECENT_CUDA) for _, major, minor in book.candidates]
    return [name for (name, _, _), v in zip(book.candidates, cap_verdicts(gate, book, gpus)) if v.status == "unknown"]


@frozen
class CapVerdict:
    """Whether a gate's GPU test stops one GPU (``cap_verdict``): ``status``, and when it is unknown, the atoms
    gpuops could not read."""

    status: str  # "open" | "blocked" | "unknown"
    unknowns: tuple[str, ...] = ()


# More non-GPU clauses than this and a gate is judged by Kleene's logic alone (2^n cases).
_MAX_CLAUSES = 6


def cap_verdict(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget | None) -> CapVerdict:
    """Does the gate's GPU test stop this GPU, whatever its other (non-GPU) clauses say?

    ``blocked``: in every case where the GPU test decides (some GPU passes, some does not), this
    GPU does not pass; ``open``: in some such case it passes (or the GPU never decides); ``unknown``:
    an atom gpuops cannot read makes the difference. So a guard ``if enabled and not is_sm100():
    raise`` is blocked on SM90 (it raises whenever the feature is used), ``if not is_sm100() or
    tp > 1: raise`` open on SM100 (tp is another reason)."""
    if gpu is None:
        ev = Evaluator(book, gpu)
        admitted(gate, ev)
        return CapVerdict("unknown", tuple(ev.unknowns))
    return cap_verdicts(gate, book, [gpu])[0]


def cap_verdicts(gate: Mapping[str, Any], book: PredicateBook, gpus: list[GpuTarget]) -> list[CapVerdict]:
    out: list[CapVerdict | None] = []
    pending = []
    for i, gpu in enumerate(gpus):
        ev = Evaluator(book, gpu)
        value = admitted(gate, ev)
        if value is False:
            out.append(CapVerdict("blocked"))
        elif value is True:
            out.append(CapVerdict("open"))
        else:
            out.append(None)
            pending.append((i, tuple(ev.unknowns)))
    if not pending:
        return [v for v in out if v is not None]
    # One value per setting: `ENABLE_X` read here and `wrapper.ENABLE_X` read through an alias of
    # another module are the same clause.
    groups: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
    for c in clause_nodes(gate["condition"]):
        if c.get("span") is not None:
            groups[_clause_key(c)].append(tuple(c["span"]))
    for key in definition_clauses(gate["condition"], book):
        groups[key].append(key)
    clause_groups = [groups[k] for k in sorted(groups, key=repr)]
    cases = (list(itertools.product((False, True), repeat=len(clause_groups)))
             if len(clause_groups) <= _MAX_CLAUSES else None)

    def overrides_of(case: tuple[bool, ...]) -> dict[tuple[Any, ...], bool]:
        return {span: value for spans, value in zip(clause_groups, case) for span in spans}
    others = [GpuTarget(major, minor, RECENT_CUDA) for _, major, minor in book.candidates]
    table: dict[tuple[Any, ...], list[bool | None]] = {}

    def passes(case: tuple[bool, ...], unknown_cap: bool | None) -> list[bool | None]:
        # The other GPUs with the unreadable atoms the other way: does the GPU part decide here?
        other_cap = None if unknown_cap is None else not unknown_cap
        key = (case, other_cap)
        if key not in table:
            overrides = overrides_of(case)
            table[key] = [admitted(gate, Evaluator(book, o, unknown_cap=other_cap, overrides=overrides)) for o in others]
        return table[key]

    def decided(gpu: GpuTarget, unknown_cap: bool | None) -> str | None:
        if cases is None:
            # Too many clauses to enumerate: Kleene's logic (a clause left open does not close it).
            value = admitted(gate, Evaluator(book, gpu, unknown_cap=unknown_cap))
            return "blocked" if value is False else "open"
        decides = False
        for case in cases:
            mine = admitted(gate, Evaluator(book, gpu, unknown_cap=unknown_cap, overrides=overrides_of(case)))
            if mine is None:
                return None
            row = passes(case, unknown_cap)
            if mine and any(p is False for p in row):
                return "open"
            if not mine and any(p for p in row):
                decides = True
        return "blocked" if decides else "open"

    for i, unknowns in pending:
        outcomes = {decided(gpus[i], unknown_cap) for unknown_cap in ((True, False) if unknowns else (None,))}
        if len(outcomes) == 1 and None not in outcomes:
            out[i] = CapVerdict(str(outcomes.pop()))
        else:
            out[i] = CapVerdict("unknown", unknowns or ("cannot tell",))
    return [v for v in out if v is not None]


def argument_key(file: str, span: Sequence[int]) -> tuple[Any, ...]:
    """The override key of a predicate definition's argument clause (its file and span)."""
    return ("argument", file, *span)


def definition_clauses(tree: Mapping[str, Any], book: PredicateBook, depth: int = 0) -> list[tuple[Any, ...]]:
    """The argument clauses of the predicates a condition calls (their definitions marked by the
    scanner, ``scan_scanner.mark_argument_clauses``), as override keys: ``if not
    can_use_fused_rope(dtype=q.dtype): raise`` fails for a dtype, not only for a GPU."""
    found: list[tuple[Any, ...]] = []
    stack: list[Any] = [tree]
    while stack and depth < 8:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        atom = node.get("atom") if node.get("op") == "cap" else None
        if isinstance(atom, dict) and atom.get("kind") == "pred":
            file = atom.get("def")
            attr = atom.get("attr")
            entry = book.entry(str(atom.get("name")), file) if (file or attr is None) else book.entry(str(atom.get("name")), None)
            if entry is not None and isinstance(entry.get("expr"), dict):
                for c in clause_nodes(entry["expr"]):
                    if c.get("argument") and c.get("span") is not None:
                        found.append(argument_key(str(entry.get("file")), c["span"]))
                found.extend(definition_clauses(entry["expr"], book, depth + 1))
            continue
        stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
    return sorted(set(found), key=repr)


def _clause_key(node: Mapping[str, Any]) -> Any:
    ref = node.get("ref")
    if ref is None:
        return ("span",) + tuple(node["span"])
    return (str(ref).split(".")[-1], node.get("cmp"), repr(node.get("value")), repr(node.get("value_ref")))


def other_clauses(gate: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The conjuncts of the condition that are not GPU tests: model lists, tp_size, nnodes, ..."""
    tree = gate["condition"]
    while tree.get("op") == "not":  # `not (A and x)`: the clauses are A's neighbours
        tree = tree["arg"]
    parts = tree["args"] if tree.get("op") == "and" else [tree]
    return [p for p in parts if not is_pure_cap(p)]


def node_text(node: Mapping[str, Any]) -> str:
    return str(node.get("text") or node.get("name") or "?")
