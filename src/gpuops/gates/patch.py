"""Plan the source patch that lets a catalog feature run on a GPU its gates leave out.

Pure: a gate scan (with the text of the files holding the feature's gates), the feature's name and
the target GPU in, a ``GatePatchPlan`` out (whole-file before/after texts, what was widened, what
stays closed and why, the launch flag). Which gates lie on the feature's path, which of their roles
a patch widens and which flag turns the feature on come from the feature's entry in the catalog
(``catalog.yaml``); only a feature with a ``patch:`` section can be patched. The apply part writes
the files; nothing here touches a host.

How a gate is widened (never by line number or regex over the file):
1. The scan gives each gate's condition as a tree with exact source spans. The planner evaluates it
   for the target GPU and finds the *capability groups* (maximal sub-expressions made only of GPU
   tests, such as ``(_is_sm90_supported or _is_sm100_supported)``) whose falsehood closes the gate;
   a group that is not needed (``nnodes == 1 or is_sm100_supported()``: the multi-node case) is
   left alone.
2. Each such group gets ``or <the target's predicate>`` in the style of its neighbours: a call
   (``is_sm120_supported()``), a platform attribute (``get_platform().is_sm120``) or a module alias
   (``_is_sm120_supported``, added next to ``_is_sm100_supported`` if the module lacks it), with an
   import added only where the name is not bound yet. The predicate must be one the release itself
   defines, with the meaning its source gives it.
3. Gates about hardware the target lacks (MNNVL, multi-node) are never touched; the plan says so.
Anything the planner does not recognise raises ``UnrecognisedLayout`` before any change is made.
A plan made from already-patched sources is empty (the widened gates now admit the target).
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import field
from typing import Any, Mapping

from gpuops.errors import GpuopsError
from gpuops.gates.catalog import Catalog, Feature, load_catalog
from gpuops.gates.evaluate import feature_gates, launch_flag
from gpuops.gates.logic import (
    RECENT_CUDA,
    Evaluator,
    GpuTarget,
    PredicateBook,
    admitted,
    cap_verdict,
    is_pure_cap,
    parse_capability,
)
from gpuops.gates.scan import GateScan
from gpuops.remote.gate_tree import is_gate_tree
from gpuops.gates.logic import admits
from gpuops.frozen import frozen
from gpuops import python_ast


class UnrecognisedLayout(GpuopsError):
    """The release's gates of the feature are not in a shape the planner knows: nothing is changed."""


@frozen
class FileChange:
    """One file of the patch, whole: its text before and after, and the gates widened in it."""

    path: str  # relative to the sglang package dir, e.g. "srt/layers/communicator.py"
    before: str
    after: str
    gates: tuple[str, ...]

    def diff(self) -> str:
        return "".join(difflib.unified_diff(
            self.before.splitlines(True), self.after.splitlines(True),
            fromfile=f"a/sglang/{self.path}", tofile=f"b/sglang/{self.path}"))


@frozen
class WidenedGate:
    """A gate the patch widens: where it is, its role, and its capability group before and after."""

    id: str
    file: str
    line: int
    function: str
    role: str
    before: str  # the capability group as it was
    after: str  # as it will be


@frozen
class ClosedGate:
    """A hardware gate the patch leaves closed for the target GPU: where it is, the GPUs it admits, and why."""

    id: str
    file: str
    line: int
    function: str
    admits: tuple[str, ...]
    why: str


@frozen
class GatePatchPlan:
    """The patch that opens a catalog feature's path to the target GPU (``plan_gate_patch``): the files changed,
    the gates widened, those left closed or already open, and the flag that turns the feature on."""

    feature: str  # the catalog feature the patch opens
    version: str | None
    target_sm: str
    changes: tuple[FileChange, ...]
    widened: tuple[WidenedGate, ...]
    left_closed: tuple[ClosedGate, ...]
    notes: tuple[str, ...]
    flag: str | None
    flag_value: str | None
    predicate: str | None = None
    already_open: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    @property
    def launch_args(self) -> tuple[str, ...]:
        if not self.flag:
            return ()
        return (self.flag,) if self.flag_value is None else (self.flag, self.flag_value)

    def diff(self) -> str:
        return "".join(change.diff() for change in self.changes)


@frozen
class _Edit:
    """The text that replaces a span of a file, from ``start`` to ``end``."""

    start: tuple[int, int]  # (line 1-based, column in characters)
    end: tuple[int, int]
    text: str
    key: str  # identical edits (one import, one alias) are made once


@frozen
class _Target:
    """The target GPU, with the release's own predicate (and platform attribute) for its family."""

    gpu: GpuTarget
    sm: str
    predicate: str  # e.g. "is_sm120_supported"
    predicate_file: str | None
    platform_attr: str | None  # e.g. "is_sm120"


def plan_gate_patch(
    scan: GateScan,
    sources: Mapping[str, str],
    feature: str,
    target_sm: str,
    catalog: Catalog | None = None,
) -> GatePatchPlan:
    """The patch that opens the path of catalog feature ``feature`` in ``scan``'s release to
    ``target_sm``. ``sources``: file (relative to the sglang package) -> text, at least for the
    files holding the feature's gates (``gate_scan_probe(with_sources=True)`` returns them for every
    feature the catalog can patch)."""
    recipe = patch_recipe(feature, catalog)
    cc = parse_capability(target_sm)
    if cc is None:
        raise GpuopsError(f"gate patch ({feature}): {target_sm!r} is not a GPU generation (expected e.g. sm120)")
    release = f"gate patch ({feature}): sglang {scan.version or '(version unknown)'}"
    if not scan.known:
        raise UnrecognisedLayout(f"gate patch ({feature}): no gate scan of the host's sglang ({scan.reason})")
    broken = [e for e in scan.errors if e.get("matches")]
    if broken:
        raise UnrecognisedLayout(f"{release}: {broken[0]['file']} does not parse ({broken[0].get('error')})")
    fgs = feature_gates(scan, recipe)
    if not any(fg.role == "runtime" for fg in fgs):
        raise UnrecognisedLayout(f"{release}: no runtime gate of {recipe.title} found; "
                                 "a release without the feature, or a layout gpuops does not know")
    gpu = GpuTarget(cc[0], cc[1], RECENT_CUDA)
    sm = f"sm{cc[0]}{cc[1]}"
    book = PredicateBook(scan)
    target: _Target | None = None

    edits: dict[str, list[_Edit]] = {}
    widened: list[WidenedGate] = []
    already_open: list[str] = []
    closed: list[ClosedGate] = []
    for fg in fgs:
        gate = fg.gate
        verdict = cap_verdict(gate, book, gpu)
        if fg.role not in recipe.widen:
            if fg.role == "hardware" and verdict.status != "open":
                closed.append(ClosedGate(str(gate["id"]), str(gate["file"]), int(gate["line"]),
                                         str(gate["function"]), tuple(_admits(gate, book)), fg.why))
            continue
        if verdict.status == "open":
            already_open.append(str(gate["id"]))
            continue
        if verdict.status == "unknown":
            raise UnrecognisedLayout(f"{release}: {gate['file']}:{gate['line']}: cannot tell whether it "
                                     f"admits {sm} ({'; '.join(verdict.unknowns)})")
        if target is None:
            target = _find_target(book, gpu, sm, release)
        source = sources.get(str(gate["file"]))
        if source is None:
            raise UnrecognisedLayout(f"{release}: the text of {gate['file']} was not provided (scan with sources)")
        for group in _groups_to_widen(gate, book, gpu, release):
            edit_list, after_text = _widen_group(gate, group, source, target, book, release)
            edits.setdefault(str(gate["file"]), []).extend(edit_list)
            widened.append(WidenedGate(str(gate["id"]), str(gate["file"]), int(gate["line"]),
                                       str(gate["function"]), fg.role, str(group.get("text")), after_text))

    changes = []
    for path in sorted(edits):
        before = sources[path]
        after = _apply(before, edits[path], path, release)
        try:
            compile(after, f"sglang/{path}", "exec")
        except SyntaxError as exc:
            raise UnrecognisedLayout(f"{release}: the patched {path} does not compile "
                                     f"(line {exc.lineno}): refusing") from None
        ids = tuple(w.id for w in widened if w.file == path)
        changes.append(FileChange(path, before, after, ids))

    flag, value = launch_flag(recipe, fgs, sources)
    notes = _notes(recipe, widened, closed, target, sm, flag, value)
    return GatePatchPlan(
        feature=recipe.name,
        version=scan.version,
        target_sm=sm,
        changes=tuple(changes),
        widened=tuple(widened),
        left_closed=tuple(closed),
        notes=tuple(notes),
        flag=flag,
        flag_value=value,
        predicate=target.predicate if target else None,
        already_open=tuple(already_open),
    )


def patch_recipe(feature: str, catalog: Catalog | None = None) -> Feature:
    """The catalog's entry for ``feature``, which must have a ``patch:`` section; otherwise one
    line naming the features that can be patched."""
    catalog = catalog or load_catalog()
    entry = catalog.feature(feature)
    if not entry.patchable:
        can = ", ".join(f.name for f in catalog.features if f.patchable) or "none"
        raise GpuopsError(f"gate patch: feature {feature!r} has no patch recipe in the gate catalog "
                          f"(features gpuops can patch: {can})")
    return entry


def _admits(gate: Mapping[str, Any], book: PredicateBook) -> list[str]:
    return admits(gate, book)


def _notes(feature: Feature, widened: list[WidenedGate], closed: list[ClosedGate], target: _Target | None, sm: str,
           flag: str | None, value: str | None) -> list[str]:
    notes = []
    if any(w.role == "auto_enable" for w in widened):
        notes.append(f"the auto-enable check now admits {sm}: SGLang turns {feature.title} on by itself "
                     "wherever that check holds")
    for gate in closed:
        notes.append(f"left closed: {gate.file}:{gate.line} ({gate.function}, admits "
                     f"{', '.join(gate.admits) or 'none'}): {gate.why}")
    if target is not None and target.predicate_file:
        notes.append(f"{target.predicate} is the release's own predicate ({target.predicate_file}); "
                     "it also requires the CUDA version its definition names")
    if flag:
        notes.append("launch with " + (f"{flag} {value}" if value else flag))
    return notes


def _find_target(book: PredicateBook, gpu: GpuTarget, sm: str, release: str) -> _Target:
    """The release's own predicate for the target's family (``is_sm120_supported``: majors [12])."""
    def exactly_family(meaning: Any) -> bool:
        return tuple(meaning.majors) == (gpu.major,) and not meaning.exact and not meaning.at_least

    names = book.names_meaning(exactly_family)
    if not names:
        raise UnrecognisedLayout(f"{release} defines no predicate for {sm} "
                                 f"(like is_sm{gpu.major}0_supported): refusing to invent one")
    preferred = [n for n in names if re.fullmatch(rf"is_sm{gpu.major}\d_supported", n)]
    name = (preferred or names)[0]
    entry = book.entry(name, None)
    attr = None
    for key, value in book.platform_attrs.items():
        if value == name:
            attr = key
            break
    return _Target(gpu, sm, name, str(entry.get("file")) if entry else None, attr)


def _cap_groups(node: Mapping[str, Any], negations: int = 0) -> list[tuple[Mapping[str, Any], int]]:
    """Maximal sub-trees made only of GPU tests, with how many ``not`` sit above each."""
    op = node.get("op")
    if op == "not":  # `not (A or B)`: the group is `A or B`, read with one negation
        return _cap_groups(node["arg"], negations + 1)
    if is_pure_cap(node) and is_gate_tree(node):
        return [(node, negations)]
    if op in ("and", "or"):
        return [g for a in node["args"] for g in _cap_groups(a, negations)]
    return []


def _groups_to_widen(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget, release: str) -> list[Mapping[str, Any]]:
    """The fewest capability groups that, made true for ``gpu``, stop the gate being closed for it."""
    guard = int(gate.get("polarity", 1)) < 0
    groups = [(g, n) for g, n in _cap_groups(gate["condition"]) if (n + (1 if guard else 0)) % 2 == 0]
    overrides: dict[tuple[int, ...], bool] = {}
    chosen: list[Mapping[str, Any]] = []

    def result(extra: Mapping[tuple[int, ...], bool]) -> bool | None:
        return admitted(gate, Evaluator(book, gpu, overrides={**overrides, **extra}))

    while result({}) is False:
        for group, _ in groups:
            span = tuple(group["span"])
            if span in overrides or Evaluator(book, gpu).eval(group) is not False:
                continue
            if result({span: True}) is not False:
                overrides[span] = True
                chosen.append(group)
                break
        else:
            raise UnrecognisedLayout(f"{release}: {gate['file']}:{gate['line']} ({gate['text'][:120]}): "
                                     "no single GPU test to widen: an unknown shape, refusing")
    return chosen


def _atoms_in(group: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The group's own GPU tests (not looking inside aliases), in source order."""
    op = group.get("op")
    if op in ("cap", "alias"):
        return [group] if is_gate_tree(group) else []
    if op in ("and", "or"):
        return [a for arg in group["args"] for a in _atoms_in(arg)]
    if op == "not":
        return _atoms_in(group["arg"])
    return []


def _widen_group(
    gate: Mapping[str, Any],
    group: Mapping[str, Any],
    source: str,
    target: _Target,
    book: PredicateBook,
    release: str,
) -> tuple[list[_Edit], str]:
    where = f"{gate['file']}:{gate['line']}"
    lines = source.splitlines(True)
    _check_span_text(lines, group, where, release)
    atoms = _atoms_in(group)
    if not atoms:
        raise UnrecognisedLayout(f"{release}: {where}: no GPU test found in {group.get('text')!r}")
    sibling = atoms[-1]
    module = _parse(source, str(gate["file"]), release)
    edits: list[_Edit] = []
    if sibling["op"] == "alias":
        if sibling.get("scope") != "module":
            raise UnrecognisedLayout(f"{release}: {where}: {sibling.get('name')} is a local name, "
                                     "not a module alias: refusing")
        new_expr, more = _alias_for(sibling, module, lines, target, book, where, release)
        edits.extend(more)
    else:
        new_expr, more = _atom_for(sibling, module, target, book, where, release)
        edits.extend(more)
    line, col, end_line, end_col = group["span"]
    text = _span_text(lines, group["span"])
    if group.get("op") == "or":
        edits.append(_Edit((end_line, end_col), (end_line, end_col), f" or {new_expr}", f"group:{line}:{col}"))
        after = f"{text} or {new_expr}"
    else:
        edits.append(_Edit((line, col), (end_line, end_col), f"({text} or {new_expr})", f"group:{line}:{col}"))
        after = f"({text} or {new_expr})"
    return edits, " ".join(after.split())


def _atom_for(
    atom_node: Mapping[str, Any],
    module: ast.Module,
    target: _Target,
    book: PredicateBook,
    where: str,
    release: str,
) -> tuple[str, list[_Edit]]:
    """The target's test written like ``atom_node`` (a call or a platform attribute), plus the
    import it needs."""
    atom = atom_node.get("atom") or {}
    text = str(atom_node.get("text") or "")
    form = atom.get("form") if atom.get("kind") == "pred" else "cc"
    if form == "platform":
        attr = str(atom.get("attr") or "")
        if not target.platform_attr:
            raise UnrecognisedLayout(f"{release}: {where}: the platform has no attribute for "
                                     f"{target.predicate}: refusing")
        if not attr or not text.endswith("." + attr):
            raise UnrecognisedLayout(f"{release}: {where}: unexpected platform test {text!r}")
        return text[: -len(attr)] + target.platform_attr, []
    if form == "call":
        name = str(atom.get("name"))
        match = re.fullmatch(rf"(.*?\b){re.escape(name)}\s*\((.*)\)", text, re.S)
        if match is None:
            raise UnrecognisedLayout(f"{release}: {where}: unexpected call {text!r}")
        prefix, args = match.group(1), match.group(2)
        expr = f"{prefix}{target.predicate}({args})"
        if prefix:  # module.is_smXX_supported(): the module provides its neighbour too
            return expr, []
        return expr, _import_edit(module, name, target, book, where, release)
    if form == "cc":
        # A raw capability comparison: use the release's predicate, imported next to nothing known.
        raise UnrecognisedLayout(f"{release}: {where}: a raw compute-capability comparison "
                                 f"({text!r}); gpuops widens predicate calls only")
    raise UnrecognisedLayout(f"{release}: {where}: cannot widen {text!r} (a {form} test)")


def _alias_for(
    alias: Mapping[str, Any],
    module: ast.Module,
    lines: list[str],
    target: _Target,
    book: PredicateBook,
    where: str,
    release: str,
) -> tuple[str, list[_Edit]]:
    """A module alias for the target next to ``alias`` (``_is_sm120_supported`` by
    ``_is_sm100_supported``), written like it; reused when the module already has it."""
    name = str(alias.get("name"))
    statement = _module_assignment(module, name)
    if statement is None:
        raise UnrecognisedLayout(f"{release}: {where}: {name} is not assigned at module level")
    inner = [a for a in _atoms_in(alias["expr"]) if a.get("op") == "cap"]
    if len(inner) != 1:
        raise UnrecognisedLayout(f"{release}: {where}: {name} does not hold exactly one GPU test")
    _check_span_text(lines, alias["expr"], where, release)
    _check_span_text(lines, inner[0], where, release)
    new_atom, edits = _atom_for(inner[0], module, target, book, where, release)
    atom_span = inner[0]["span"]
    value_span = alias["expr"]["span"]
    new_value = _replace_within(lines, value_span, atom_span, new_atom)
    token = re.search(r"sm\d+|blackwell|hopper", name)
    found = re.search(r"sm\d+", target.predicate) or re.search(r"sm\d+", target.sm)
    if found is None:
        raise UnrecognisedLayout(f"{release}: {where}: target {target.sm!r} names no SM family")
    family = found.group(0)
    new_name = (name[: token.start()] + family + name[token.end():]) if token else f"_is_{family}_supported"
    existing = _module_assignment(module, new_name)
    if existing is not None:
        existing_text = ast.get_source_segment("".join(lines), existing.value) or ""
        if " ".join(existing_text.split()) != " ".join(new_value.split()):
            raise UnrecognisedLayout(f"{release}: {where}: {new_name} already exists with another "
                                     f"meaning ({existing_text!r}): refusing")
        return new_name, edits
    end_line = statement.end_lineno or statement.lineno
    first = lines[statement.lineno - 1]
    indent = first[: len(first) - len(first.lstrip())]
    insertion = f"{indent}{new_name} = {new_value}\n"
    edits.append(_Edit((end_line + 1, 0), (end_line + 1, 0), insertion, f"alias:{new_name}"))
    return new_name, edits


def _import_edit(module: ast.Module, sibling: str, target: _Target, book: PredicateBook, where: str,
                 release: str) -> list[_Edit]:
    """Add the target predicate to the ``from X import ...`` that brings in ``sibling``, when the
    module does not bind it yet and both come from the same defining file."""
    if _binds(module, target.predicate):
        return []
    for node in ast.walk(module):
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            if (alias.asname or alias.name) != sibling:
                continue
            sibling_entry = book.entry(alias.name, None)
            if sibling_entry is None or target.predicate_file is None or str(sibling_entry.get("file")) != target.predicate_file:
                raise UnrecognisedLayout(f"{release}: {where}: {sibling} and {target.predicate} are "
                                         f"not defined side by side; cannot tell where to import it from")
            line = alias.end_lineno or node.lineno
            col = alias.end_col_offset if alias.end_col_offset is not None else 0
            text = lines_of(module)[line - 1] if lines_of(module) else ""
            own_line = re.fullmatch(rf"(\s*){re.escape(ast.unparse(alias))}\s*,\s*(#.*)?\n?", text)
            if own_line:  # one name a line in parentheses: add ours on the next line, same indent
                return [_Edit((line + 1, 0), (line + 1, 0), f"{own_line.group(1)}{target.predicate},\n",
                              f"import:{target.predicate}")]
            return [_Edit((line, -col - 1), (line, -col - 1), f", {target.predicate}", f"import:{target.predicate}")]
    raise UnrecognisedLayout(f"{release}: {where}: {sibling} is not imported with 'from ... import': "
                             f"cannot add {target.predicate} beside it")


def _binds(module: ast.Module, name: str) -> bool:
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _module_assignment(module: ast.Module, name: str) -> ast.Assign | None:
    found = None
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = node
    return found


def lines_of(module: ast.Module) -> list[str]:
    return getattr(module, "_gpuops_lines", [])


def _parse(source: str, path: str, release: str) -> ast.Module:
    try:
        module = python_ast.parse_module(source)
        module._gpuops_lines = source.splitlines(True)  # type: ignore[attr-defined]
        return module
    except SyntaxError as exc:
        raise UnrecognisedLayout(f"{release}: {path} does not parse here (line {exc.lineno})") from None


def _span_text(lines: list[str], span: list[int]) -> str:
    line, col, end_line, end_col = span
    if line == end_line:
        return lines[line - 1][col:end_col]
    return lines[line - 1][col:] + "".join(lines[line:end_line - 1]) + lines[end_line - 1][:end_col]


def _replace_within(lines: list[str], outer: list[int], inner: list[int], text: str) -> str:
    """The source of ``outer`` with its sub-span ``inner`` replaced by ``text``."""
    before = _span_text(lines, [outer[0], outer[1], inner[0], inner[1]])
    after = _span_text(lines, [inner[2], inner[3], outer[2], outer[3]])
    return before + text + after


def _check_span_text(lines: list[str], node: Mapping[str, Any], where: str, release: str) -> None:
    """The scan's text of a node must be what the provided source holds at that span."""
    try:
        actual = " ".join(_span_text(lines, node["span"]).split())
    except (IndexError, ValueError, TypeError):
        actual = None
    expected = str(node.get("text") or "")
    if expected.endswith("...") and actual is not None:
        ok = actual.startswith(expected[:-3])
    else:
        ok = actual == expected
    if not ok:
        raise UnrecognisedLayout(f"{release}: {where}: the source differs from the scan "
                                 f"(expected {expected[:80]!r}); scan again")


def _apply(source: str, edits: list[_Edit], path: str, release: str) -> str:
    lines = source.splitlines(True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def position(line: int, col: int) -> int:
        if line == len(lines) + 1 and col == 0:
            return len(source)
        if not 1 <= line <= len(lines):
            raise UnrecognisedLayout(f"{release}: {path}: position {line}:{col} outside the file")
        if col < 0:  # a byte column from Python's ast: -(bytes) - 1
            raw = lines[line - 1].encode("utf-8")[: -col - 1]
            col = len(raw.decode("utf-8", "replace"))
        return offsets[line - 1] + col

    unique: dict[str, _Edit] = {}
    for edit in edits:
        unique.setdefault(edit.key, edit)
    placed = sorted(((position(*e.start), position(*e.end), e.text) for e in unique.values()), reverse=True)
    out = source
    last_start = None
    for start, end, text in placed:
        if last_start is not None and end > last_start:
            raise UnrecognisedLayout(f"{release}: {path}: two changes overlap: refusing")
        out = out[:start] + text + out[end:]
        last_start = start
    return out
