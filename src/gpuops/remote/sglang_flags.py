"""On the host: the launch flags the installed SGLang's server parser accepts, with each flag's kind,
type and choices, read from the release's own argument sources (stdlib only, Python 3.8+; nothing
of SGLang is imported: importing it starts CUDA).

``gpuops tune --sweep flag=v1,v2`` ships this to every host before anything changes, and refuses a
flag or a value the release running there would refuse. What is read, as each release registers it:

  * ``parser.add_argument("--name", "--alias", type=int, choices=[...], action="store_true", dest=)``
    (0.5.8 has its ~330 flags this way in ``srt/server_args.py``; later releases keep a few);
  * annotated fields ``name: A[T, "help"]`` / ``A[T, Arg(choices=..., aliases=..., cli_name=...,
    action=..., no_cli=True)]`` that ``arg_utils.add_cli_args_from_dataclass`` turns into flags
    (0.5.16's ``ServerArgs``, 0.5.21+'s ``arg_groups/fields/*.py``), as that function does: ``bool``
    is a switch, ``Literal[...]`` gives the choices, ``List[T]`` takes several words, ``Optional``
    is unwrapped;
  * choices given by name (``choices=LOAD_FORMAT_CHOICES``) resolved from the module-level lists of
    the same sources (``arg_groups/choices.py`` in 0.5.23); choices computed at start-up (a set
    built in ``add_cli_args``) stay unknown: any value passes here and the release decides.

The payload names the server's port (and the inventory's python and PYTHONPATH for a host whose
server is down); the answer is one JSON line::

    {"ok": true, "version": "0.5.16", "root": ".../sglang", "speculative": false, "speculative_flags": [],
     "flags": {"--speculative-num-steps": {"dest": "speculative_num_steps", "kind": "value",
               "type": "int", "choices": null, "aliases": []}, ...}}
    {"ok": false, "error": "..."}
"""

import ast
import json
import os
import re
import sys

from gpuops.remote import sglang_argv
from gpuops.remote.bench_snapshot import server_python_env
from gpuops.remote.scan_ast import AST_INDEX, last_name
from gpuops.remote.sglang_server import find_server_pid, installed_root, process_cmdline

SOURCES = (("srt", "server_args.py"), ("srt", "arg_groups"))
_SWITCH_ACTIONS = ("store_true", "store_false", "count", "DeprecatedStoreTrueAction", "BooleanOptionalAction")
_TYPES = {"int": "int", "float": "float", "str": "str", "bool": "bool"}


def _text(node):
    """A string literal (``"a" "b"`` is one; ``"a" + "b"`` is folded); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _keyword(call, name):
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def _values(node, constants):
    """A list of literal choices: a list/tuple/set of constants, a module-level name holding one,
    ``a + b``, ``list(x)`` / ``sorted(x)`` / ``tuple(x)``; None when the source does not say."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for element in node.elts:
            if isinstance(element, ast.Constant) and isinstance(element.value, (str, int, float)) \
                    and not isinstance(element.value, bool):
                out.append(element.value)
            elif isinstance(element, ast.Starred):
                inner = _values(element.value, constants)
                if inner is None:
                    return None
                out.extend(inner)
            else:
                return None
        return out
    if isinstance(node, ast.Name):
        found = constants.get(node.id)
        return list(found) if found is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _values(node.left, constants), _values(node.right, constants)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.Call) and last_name(node.func) in ("list", "sorted", "tuple") and len(node.args) == 1:
        inner = _values(node.args[0], constants)
        return sorted(inner, key=str) if inner is not None and last_name(node.func) == "sorted" else inner
    return None


def module_constants(trees):
    """``{NAME: [values]}`` of every module-level ``NAME = [literal list]`` of the sources (names that
    refer to others resolved in a few passes: ``A = B + ["x"]``)."""
    assigned = []
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigned.append((node.targets[0].id, node.value))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                assigned.append((node.target.id, node.value))
    constants = {}
    for _ in range(4):
        for name, value in assigned:
            if name not in constants:
                found = _values(value, constants)
                if found is not None:
                    constants[name] = found
    return constants


def _record(names, dest, kind, type_name, choices):
    return {"names": list(names), "dest": dest, "kind": kind, "type": type_name,
            "choices": [str(c) for c in choices] if choices is not None else None}


def _from_add_argument(call, constants):
    names = [t for t in (_text(a) for a in call.args) if t and t.startswith("--")]
    if not names:
        return None
    dest = _text(_keyword(call, "dest")) if _keyword(call, "dest") is not None else None
    dest = dest or names[0][2:].replace("-", "_")
    action = _keyword(call, "action")
    action_name = _text(action) if action is not None and _text(action) is not None else last_name(action)
    if action_name in _SWITCH_ACTIONS:
        return _record(names, dest, "switch", "bool", None)
    nargs = _text(_keyword(call, "nargs")) if _keyword(call, "nargs") is not None else None
    type_name = _TYPES.get(last_name(_keyword(call, "type")) or "", "str")
    choices_node = _keyword(call, "choices")
    choices = _values(choices_node, constants) if choices_node is not None else None
    unknown_choices = choices_node is not None and choices is None
    kind = "list" if nargs in ("+", "*") else "value"
    record = _record(names, dest, kind, type_name, choices)
    if unknown_choices:
        record["choices_unknown"] = True
    return record


def _slice(subscript):
    """A subscript's index (Python 3.8 wraps it in ``ast.Index``)."""
    return subscript.slice.value if isinstance(subscript.slice, AST_INDEX) else subscript.slice


def _unwrap(annotation):
    """(base name, its arguments) of ``Optional[X]`` -> X's; ``Union[X, None]`` likewise."""
    while isinstance(annotation, ast.Subscript) and last_name(annotation.value) in ("Optional", "Union"):
        inner = _slice(annotation)
        parts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        parts = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        if len(parts) != 1:
            return None, []
        annotation = parts[0]
    if isinstance(annotation, ast.Subscript):
        inner = _slice(annotation)
        return last_name(annotation.value), (inner.elts if isinstance(inner, ast.Tuple) else [inner])
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a string annotation
        try:
            return _unwrap(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return None, []
    return last_name(annotation), []


def _from_field(node, constants):
    """An ``A[T, "help"]`` / ``A[T, Arg(...)]`` field as ``add_cli_args_from_dataclass`` adds it."""
    annotation = node.annotation
    if not (isinstance(node.target, ast.Name) and isinstance(annotation, ast.Subscript)
            and last_name(annotation.value) in ("A", "Annotated")):
        return None
    inner = _slice(annotation)
    parts = inner.elts if isinstance(inner, ast.Tuple) else []
    if len(parts) < 2:
        return None
    meta = parts[1]
    arg = meta if isinstance(meta, ast.Call) and last_name(meta.func) == "Arg" else None
    if arg is None and _text(meta) is None:
        return None  # neither help text nor Arg: the function skips it
    field = node.target.id
    cli = "--" + field.replace("_", "-")
    aliases, choices, choices_node, action = [], None, None, None
    if arg is not None:
        no_cli = _keyword(arg, "no_cli")
        if isinstance(no_cli, ast.Constant) and no_cli.value is True:
            return None
        cli = _text(_keyword(arg, "cli_name")) or cli if _keyword(arg, "cli_name") is not None else cli
        alias_node = _keyword(arg, "aliases")
        if isinstance(alias_node, (ast.List, ast.Tuple)):
            aliases = [t for t in (_text(e) for e in alias_node.elts) if t]
        choices_node = _keyword(arg, "choices")
        choices = _values(choices_node, constants) if choices_node is not None else None
        action = _keyword(arg, "action")
    names = [cli] + aliases
    if action is not None:
        action_name = _text(action) or last_name(action)
        kind = "switch" if action_name in _SWITCH_ACTIONS else "value"
        return _record(names, field, kind, "bool" if kind == "switch" else "str", None)
    base, args = _unwrap(parts[0])
    if base == "Literal":
        literal = _values(ast.List(elts=list(args), ctx=ast.Load()), constants)
        type_name = type(literal[0]).__name__ if literal else "str"
        return _record(names, field, "value", _TYPES.get(type_name, "str"), choices or literal)
    if base in ("List", "list"):
        element = last_name(args[0]) if args else "str"
        return _record(names, field, "list", _TYPES.get(element or "", "str"), choices)
    if base == "bool":
        return _record(names, field, "switch", "bool", None)
    type_parser = _keyword(arg, "type_parser") if arg is not None else None
    record = _record(names, field, "value", "str" if type_parser is not None else _TYPES.get(base or "", "str"),
                     choices)
    if choices_node is not None and choices is None:
        record["choices_unknown"] = True
    return record


def source_files(root):
    """The release's argument sources under its ``sglang`` package directory, in a stable order."""
    found = []
    for parts in SOURCES:
        path = os.path.join(root, *parts)
        if os.path.isfile(path):
            found.append(path)
        elif os.path.isdir(path):
            for folder, dirs, files in os.walk(path):
                dirs.sort()
                found.extend(os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
    return found


def parser_flags(texts, unread=None):
    """``{"--flag": record}`` (every name, aliases included, to its flag's record) from the sources'
    texts (``{path: text}``). A source this python cannot parse (written for a newer one) is skipped
    and its path added to ``unread``."""
    trees = []
    for path, text in sorted(texts.items()):
        try:
            trees.append(ast.parse(text, filename=path))
        except (SyntaxError, ValueError):
            if unread is not None:
                unread.append(path)
    constants = module_constants(trees)
    flags = {}
    for tree in trees:
        for node in ast.walk(tree):
            record = None
            if isinstance(node, ast.Call) and last_name(node.func) == "add_argument":
                record = _from_add_argument(node, constants)
            elif isinstance(node, ast.AnnAssign):
                record = _from_field(node, constants)
            if record is None:
                continue
            for name in record["names"]:
                flags[name] = record
    return flags


def read_sources(root, limit=16 * 1024 * 1024):
    texts = {}
    for path in source_files(root):
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > limit:
                continue  # a regular file of a sane size only: anything else is not a source
            with open(path, "r", encoding="utf-8", errors="replace") as handle:
                texts[path] = handle.read(limit)
        except OSError:
            continue
    return texts


def release_version(root):
    """The release's version: its ``_version.py`` (a built wheel), else the ``sglang-X.dist-info``
    beside the package (``version.py`` itself falls back to 0.0.0.dev0 without metadata)."""
    try:
        with open(os.path.join(root, "_version.py"), "r", encoding="utf-8", errors="replace") as handle:
            match = re.search(r"""__version__\s*=\s*["']([^"']{1,40})["']""", handle.read(65536))
        if match:
            return match.group(1)
    except OSError:
        pass
    try:
        names = os.listdir(os.path.dirname(root.rstrip("/")))
    except OSError:
        return None
    found = sorted(m.group(1) for m in (re.match(r"^sglang-([0-9][A-Za-z0-9.+]*)\.dist-info$", n) for n in names) if m)
    return found[-1] if len(found) == 1 else None


def answer(payload):
    port = int(payload.get("port") or 30000)
    pid = find_server_pid("http://127.0.0.1:%d" % port)
    argv = process_cmdline(pid) if pid is not None else None
    python = argv[0] if argv and argv[0].startswith("/") else (payload.get("python") or None)
    env = server_python_env(pid, payload.get("pythonpath"))
    root = installed_root(python, env)
    if not root:
        where = "the server on port %d" % port if pid is not None else "python %s" % (python or "python3")
        return {"ok": False, "error": "no SGLang found for %s: its server flags cannot be read" % where}
    unread = []
    flags = parser_flags(read_sources(root), unread)
    if "--model-path" not in flags or "--port" not in flags:
        return {"ok": False, "error": "SGLang at %s: its server arguments could not be read (no --model-path / "
                                      "--port found)" % root}
    words = sglang_argv.launch_args(argv) if argv else None
    spec = sglang_argv.flag_value(words, "--speculative-algorithm") if words else None
    # the speculative flags the server was launched with: what a run without speculation takes out
    launched = sorted(set(w.split("=", 1)[0] for w in words or () if w.startswith("--speculative-")))
    return {"ok": True, "version": release_version(root), "root": root, "running": pid is not None,
            "speculative": isinstance(spec, str) and spec.upper() != "NONE", "speculative_flags": launched,
            "flags": flags,
            "unread": [os.path.relpath(p, root) for p in unread], "python": sys.version.split()[0]}


if __name__ == "__main__":
    print(json.dumps(answer(json.loads(GPUOPS_PAYLOAD or b"{}"))))  # type: ignore[name-defined]  # noqa: F821
