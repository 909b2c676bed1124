"""Whether a catalogued feature is in effect in the RUNNING server (pure): true, false or null
(cannot tell), with the reason.

The server's own word comes first: where it reports its resolved settings (``/server_info``, every
decision SGLang made applied: ``facts/server_report.py``), the feature's settings there decide,
and the reason says so; where gpuops' own judgement below differs, the reason gives both. A
runtime gate that closes the feature on this GPU still wins over a setting that asks for it (the
setting is on, the kernel never runs), and the reason says that too.

Without a report (no server, a release that reports nothing, a report that failed) the judgement
combines three things, in this order:
1. the runtime gates: closed on this GPU means the feature never runs, whatever the flags say;
2. the launch flags: the server was started with the feature's flag on (or explicitly off);
3. SGLang's own auto-enable decision, when no flag was given: each auto-enable gate is judged
   entirely, its GPU test AND every other clause (model architecture, tp_size, nnodes, dp
   attention...) against the server's own settings, AND the conditions it is nested in (``if
   model_arch in [...]:`` around it), read back from their source text. One that holds turns the
   feature on (a DeepseekV3 model at TP 8 on sm90: on by itself, no flag needed).

An all-reduce path (``all_reduce: true`` in the catalog) is never in effect in a server at TP 1,
whatever its settings ask for: a TP group of one GPU has no all-reduce (``lone_gpu``).
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Any, Mapping, Sequence

from gpuops import python_ast
from gpuops.gates.logic import Evaluator, GpuTarget, PredicateBook, normalise_args, server_key
from gpuops.remote.gate_tree import clause_nodes

_OFF = (None, False, "", "none", "None", "false", "False", "0")


def asks_for(choice: Any, value: Any) -> bool:
    """Whether a setting's value asks for the feature: a setting that selects among choices
    (``attention_backend``) only with one of the feature's values (``triton`` is another
    backend, not this one), a switch with any value that is not off. An inverse switch's value
    asks for turning it off: its callers read it so."""
    if choice.selects:
        return str(value) in choice.values
    return value not in _OFF


def _flag_state(flags: Sequence[Any], server: Mapping[str, Any]) -> tuple[bool | None, str | None]:
    """(True/False, text) when the server was given one of the feature's flags; (None, None) if not."""
    args = normalise_args(server.get("args"))
    for choice in flags:
        if choice.setting not in args:
            continue
        value = args[choice.setting]
        given = f"launched with {choice.flag}" + ("" if value is True else f" {value}")
        if choice.inverse:
            if value not in _OFF:
                return False, given
            continue
        if choice.selects:
            if asks_for(choice, value):
                return True, given
            return False, f"{given} (another choice than {', '.join(choice.values)})"
        if asks_for(choice, value):
            return True, given
        return False, f"launched with {choice.setting}={value!r} (off)"
    return None, None


def _ref_value(ref: str, args: Mapping[str, Any], architecture: str | None) -> tuple[bool, Any]:
    key = server_key(ref)
    if key == "architecture":
        return architecture is not None, architecture
    if key is not None and key in args:
        return True, args[key]
    return False, None


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return False, None


def _eval_text(node: ast.AST, args: Mapping[str, Any], architecture: str | None,
               gate_lookup: Any) -> bool | None:
    """Kleene evaluation of an enclosing condition's text: refs to server settings, literals,
    comparisons, and/or/not; a sub-condition that is itself a scanned gate is judged as that gate
    (``gate_lookup``; None: there are none to look up, and no node's text is spelled out for it)."""
    judged = gate_lookup(ast.unparse(node)) if gate_lookup is not None and hasattr(ast, "unparse") else None
    if judged is not None:
        return judged
    if isinstance(node, ast.BoolOp):
        values = [_eval_text(v, args, architecture, gate_lookup) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _eval_text(node.operand, args, architecture, gate_lookup)
        return None if inner is None else not inner
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        node = node.func  # is_hip() / is_dp_attention_enabled(): a setting read by a call
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        known, value = _ref_value(ast.unparse(node), args, architecture)
        return (value not in _OFF) if known else None
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right, op = node.left, node.comparators[0], node.ops[0]
        lok, lval = _literal(left)
        rok, rval = _literal(right)
        if not lok:
            lok, lval = _ref_value(ast.unparse(left), args, architecture)
        if not rok:
            rok, rval = _ref_value(ast.unparse(right), args, architecture)
        if not (lok and rok):
            return None
        try:
            if isinstance(op, (ast.In, ast.NotIn)):
                inside = lval in rval if isinstance(rval, (list, tuple, set, str)) else None
                return None if inside is None else (inside if isinstance(op, ast.In) else not inside)
            if isinstance(lval, str) and isinstance(rval, (int, float)):
                lval = float(lval)
            if isinstance(rval, str) and isinstance(lval, (int, float)):
                rval = float(rval)
            table = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Gt: lambda a, b: a > b,
                     ast.GtE: lambda a, b: a >= b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b}
            for kind, fn in table.items():
                if isinstance(op, kind):
                    return bool(fn(lval, rval))
        except (TypeError, ValueError):
            return None
    return None


def _device_overrides(fgs: Sequence[Any], gpu_name: Any) -> dict[tuple[int, ...], bool]:
    """Clauses about the device's name (``is_h20_device``: a known FlashInfer bug on H20), judged
    from the host's GPU name."""
    if not gpu_name:
        return {}
    name = str(gpu_name)
    is_h20 = "H20" in name and "H200" not in name
    out: dict[tuple[int, ...], bool] = {}
    for fg in fgs:
        for node in clause_nodes(fg.gate["condition"]):
            if re.search(r"\bis_h20", str(node.get("text") or ""), re.I) and node.get("span"):
                out[tuple(node["span"])] = is_h20
    return out


def condition_tree(text: Any) -> ast.expr:
    """The expression tree of a condition's source text (parenthesised: it may span lines)."""
    return python_ast.parse_expression("(" + str(text).strip() + ")")


@functools.lru_cache(maxsize=4096)
def normal_text(text: str) -> str:
    """Source text of a condition, spelled one way (spacing, quotes, line breaks). Kept per text:
    ``unreachable`` spells every gate of the function again for each gate it is asked about."""
    try:
        return ast.unparse(condition_tree(text))
    except SyntaxError:
        return text.strip()


def unreachable(gate: Mapping[str, Any], all_gates: Sequence[Mapping[str, Any]], book: PredicateBook,
                gpu: GpuTarget) -> bool:
    """Whether an enclosing condition of ``gate`` is false for ``gpu`` (read from the text, with
    sub-conditions that are scanned gates of the same function judged as such)."""
    within = gate.get("within") or ()
    if not within:
        return False
    same = {normal_text(str(g.get("text") or "")): g for g in all_gates
            if g["file"] == gate["file"] and g["function"] == gate["function"]}

    def lookup(text: str) -> bool | None:
        other = same.get(normal_text(text))
        return Evaluator(book, gpu, None).eval(other["condition"]) if other is not None else None

    for text in within:
        try:
            tree = condition_tree(text)
        except SyntaxError:
            continue
        if _eval_text(tree, {}, None, lookup) is False:
            return True
    return False


def platform_value(text: str, platforms: Mapping[str, bool]) -> bool | None:
    """The truth of an enclosing condition's text from platform names alone (``_is_musa`` False on
    an NVIDIA host); None when it depends on anything else."""
    return _platform_value(text, tuple(sorted(platforms.items())))


@functools.lru_cache(maxsize=4096)
def _platform_value(text: str, platforms: tuple[tuple[str, bool], ...]) -> bool | None:
    # Pure in its two arguments, and asked again for the same few hundred texts: every feature's
    # pass over the gates asks it of each enclosing condition (a third of judging a release's scan).
    try:
        tree = condition_tree(text)
    except SyntaxError:
        return None
    return _eval_text(tree, dict(platforms), None, None)


def settings_value(text: str, args: Mapping[str, Any]) -> bool | None:
    """The truth of an enclosing condition's text from the server's settings in ``args`` alone
    (``self.tp_size == 1`` False under TP 8); None when it depends on anything else."""
    try:
        tree = condition_tree(text)
    except SyntaxError:
        return None
    return _eval_text(tree, args, None, None)


def _disables(gate: Mapping[str, Any], settings: Sequence[str]) -> bool:
    """An auto-enable-role gate whose branch switches the feature OFF (``x = False``)."""
    text = str(gate.get("excerpt") or "")
    return any(re.search(rf"\b{re.escape(s)}\s*=\s*(False|None|\"none\"|'none')", text) for s in settings)


def reported_state(feature: Any, server: Mapping[str, Any] | None) -> tuple[bool | None, str | None]:
    """(on, text) from the settings the server reports for itself; (None, None) when it reports
    none of the feature's settings. On when any of them asks for it (a release may report the old
    switch and the new backend setting side by side), off when every one it reports is off."""
    reported = (server or {}).get("reported") or {}
    settings = reported.get("settings") if isinstance(reported, Mapping) and not reported.get("error") else None
    if not isinstance(settings, Mapping):
        return None, None
    said = []
    plain_reported = False
    for choice in feature.flags:
        if choice.setting not in settings:
            continue
        value = settings[choice.setting]
        # A setting the server reports as null is said as its JSON spelling, never Python's "None".
        shown = f"{choice.setting}=null" if value is None else f"{choice.setting}={value!r}"
        said.append(shown)
        if choice.inverse:
            if value not in _OFF:
                return False, f"the server reports {shown}"
            continue
        plain_reported = True
        if asks_for(choice, value):
            return True, f"the server reports {shown}"
    if not said:
        return None, None
    if not plain_reported and getattr(feature, "default", None) == "on":
        # only its off switches were reported, none set: a default-on feature (custom all-reduce) runs
        return True, "the server reports " + ", ".join(said)
    return False, "the server reports " + ", ".join(said)


def server_tp_size(server: Mapping[str, Any]) -> tuple[int | None, str]:
    """The server's TP size and where it was read: its own report first, else its launch flags
    (SGLang's default, 1, where it was launched without one)."""
    reported = server.get("reported") or {}
    settings = reported.get("settings") if isinstance(reported, Mapping) and not reported.get("error") else None
    if isinstance(settings, Mapping) and isinstance(settings.get("tp_size"), int):
        route = reported.get("route") or "/server_info"
        return settings["tp_size"], f"the server reports tp_size={settings['tp_size']} in {route}"
    tp = server.get("tp_size")
    if tp is None:
        tp = normalise_args(server.get("args"), server.get("defaults")).get("tp_size")
    try:
        return (int(tp), f"its launch flags give TP {int(tp)}") if tp is not None else (None, "")
    except (TypeError, ValueError):
        return None, ""


def lone_gpu(feature: Any, server: Mapping[str, Any] | None) -> str | None:
    """Why an all-reduce path (``all_reduce: true`` in the catalog) is not in effect in the running
    server: its TP group is one GPU. None where that is not so, or not known."""
    if not getattr(feature, "all_reduce", False) or server is None or not server.get("running", True):
        return None
    tp, source = server_tp_size(server)
    if tp != 1:
        return None
    return (f"TP 1 ({source}): a TP group of one GPU has no all-reduce; SGLang builds no all-reduce communicator "
            "for a world size of 1 and its all_reduce returns the input (srt/distributed/parallel_state.py)")


def in_effect(feature: Any, fgs: Sequence[Any], by_id: Mapping[str, Mapping[str, Any]], book: PredicateBook,
              gpu: GpuTarget | None, server: Mapping[str, Any] | None, all_gates: Sequence[Mapping[str, Any]],
              status: str, flag_text: str | None) -> tuple[bool | None, str]:
    value, why = _in_effect(feature, fgs, by_id, book, gpu, server, all_gates, status, flag_text)
    lone = lone_gpu(feature, server)
    if lone is not None:
        # TP 1 decides, whatever the settings ask for; what they say is kept beside it.
        return False, f"{lone} (apart from that: {why})"
    return value, why


def _in_effect(feature: Any, fgs: Sequence[Any], by_id: Mapping[str, Mapping[str, Any]], book: PredicateBook,
               gpu: GpuTarget | None, server: Mapping[str, Any] | None, all_gates: Sequence[Mapping[str, Any]],
               status: str, flag_text: str | None) -> tuple[bool | None, str]:
    judged, why = judged_in_effect(feature, fgs, by_id, book, gpu, server, all_gates, status, flag_text)
    said, text = reported_state(feature, server)
    if said is None or not (server or {}).get("running", True):
        return judged, why
    route = ((server or {}).get("reported") or {}).get("route") or "/server_info"
    text = f"{text} in its resolved settings ({route})"
    blocked = [by_id[str(fg.gate["id"])] for fg in fgs
               if fg.role == "runtime" and by_id[str(fg.gate["id"])]["status"] == "blocked"]
    if said and blocked:
        return False, f"{text}, but {why}"
    if judged is None:
        return said, f"{text} (gpuops' own judgement could not tell: {why})"
    if judged == said:
        return said, f"{text}; gpuops' own judgement agrees: {why}"
    return said, (f"{text}, and the server's word is taken; gpuops' own judgement says "
                  f"{'on' if judged else 'off'}: {why}")


def judged_in_effect(feature: Any, fgs: Sequence[Any], by_id: Mapping[str, Mapping[str, Any]], book: PredicateBook,
                     gpu: GpuTarget | None, server: Mapping[str, Any] | None, all_gates: Sequence[Mapping[str, Any]],
                     status: str, flag_text: str | None) -> tuple[bool | None, str]:
    """gpuops' own judgement: the runtime gates, the launch flags, SGLang's auto-enable gates."""
    if server is None:
        return None, "no server settings to judge against"
    if not server.get("running", True):
        return None, "no SGLang server is running"
    runtime = [by_id[str(fg.gate["id"])] for fg in fgs if fg.role == "runtime"]
    blocked = [g for g in runtime if g["status"] == "blocked"]
    if blocked:
        return False, (f"a runtime gate closes it on {gpu.sm if gpu else 'this GPU'} "
                       f"({blocked[0]['file']}:{blocked[0]['line']}), so it never runs")
    if status == "unknown":
        return None, "cannot tell: the feature's gates could not be judged for this GPU"
    on, text = _flag_state(feature.flags, server)
    if on is not None:
        return on, text or ""
    auto = [fg for fg in fgs if fg.role == "auto_enable" and not _disables(fg.gate, [c.setting for c in feature.flags])]
    flags = flag_text or " or ".join(c.flag + (" " + "|".join(c.values) if c.selects else "")
                                     for c in feature.flags if not c.inverse) or "a flag"
    default = getattr(feature, "default", "off")
    if default == "on" and not auto:
        return True, "SGLang uses it by default where its runtime gates admit this GPU, and they do"
    if not auto:
        if default == "auto":
            return None, (f"not launched with {flags}: SGLang chooses at start-up from the model and the GPU "
                          "(no auto-enable gate found to judge); launch with the flag to be sure")
        return False, f"not launched with {flags}, and this release does not turn it on by itself"
    args = normalise_args(server.get("args"), server.get("defaults"))
    architecture = server.get("architecture")
    by_text: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for gate in all_gates:
        by_text.setdefault((str(gate["file"]), str(gate["function"]), normal_text(str(gate.get("text") or ""))), gate)
    overrides = _device_overrides(auto, server.get("gpu_name"))
    evaluator = Evaluator(book, gpu, server, overrides=overrides)
    verdicts = []
    for fg in auto:
        gate = fg.gate

        def lookup(text: str, gate: Mapping[str, Any] = gate) -> bool | None:
            other = by_text.get((str(gate["file"]), str(gate["function"]), text))
            return Evaluator(book, gpu, server).eval(other["condition"]) if other is not None else None

        own = evaluator.eval(gate["condition"])
        if gate.get("polarity", 1) == -1 and own is not None:
            own = not own
        nested: list[bool | None] = []
        for text in gate.get("within") or ():
            try:
                tree = condition_tree(text)
            except SyntaxError:
                nested.append(None)
                continue
            nested.append(_eval_text(tree, args, architecture, lookup))
        values = [own, *nested]
        value = False if False in values else (None if None in values else True)
        verdicts.append((value, gate))
    where = lambda g: f"{g['file']}:{by_id[str(g['id'])]['line']} ({g['function']})"  # noqa: E731
    model = f"model {architecture or 'unknown'}, tp {args.get('tp_size')}"
    for value, gate in verdicts:
        if value is True:
            return True, (f"not launched with {flags}, but SGLang turns it on by itself: the auto-enable gate at "
                          f"{where(gate)} and every clause around it hold for this server ({model})")
    unknown = [g for v, g in verdicts if v is None]
    if unknown:
        return None, (f"not launched with {flags}; cannot tell whether SGLang turns it on by itself: a clause of "
                      f"{where(unknown[0])} cannot be judged for this server ({model})")
    return False, (f"not launched with {flags}, and SGLang's auto-enable does not apply to this server ({model}; "
                   f"{where(verdicts[0][1])} does not hold)")
