"""The flags an SGLang release's server accepts, read from its own argument sources, and the
inventory's launch flags checked against them.

Two shapes exist in real releases: ``parser.add_argument("--name", ...)`` calls (0.5.8 has all of
its ~330 there), and annotated dataclass fields ``name: A[T, "help"]`` / ``A[T, Arg(...)]`` that
``add_cli_args_from_dataclass`` turns into ``--name`` (0.5.21's ``arg_groups/fields``; ``Arg``'s
``cli_name``, ``aliases`` and ``no_cli`` are honoured as that function does). A flag the release
itself calls deprecated (``DeprecatedStoreTrueAction(new_flag=...)`` or a help text "(Deprecated:
use --x=y)") is translated to its replacement with a note; a flag the release does not know is
refused, naming the closest one it has. Read with ``ast``: nothing of the release is imported.
"""

from __future__ import annotations

import ast
import difflib
import re
from typing import Any, Iterable, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.frozen import frozen
from gpuops import python_ast

_DEPRECATED_HELP = re.compile(r"\(Deprecated: use (--[a-z0-9][a-z0-9-]*(?:=[A-Za-z0-9_.-]+)?)\)")


@frozen
class AcceptedFlags:
    """Every ``--flag`` a release's server parser accepts (``release_flags``), and the deprecated switches the
    release itself says how to replace."""

    names: frozenset[str]
    replacements: Mapping[str, tuple[str, ...]]   # deprecated switch -> the words that replace it


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "a " "b" is one Constant; a + b is not
        left, right = _text(node.left), _text(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _add_argument(call: ast.Call, names: set[str], replacements: dict[str, tuple[str, ...]]) -> None:
    flags = [t for t in (_text(a) for a in call.args) if t and t.startswith("--")]
    names.update(flags)
    if not flags:
        return
    new = _keyword(call, "new_flag")
    new_text = _text(new) if new is not None else None
    help_node = _keyword(call, "help")
    help_text = _text(help_node) if help_node is not None else None
    match = _DEPRECATED_HELP.search(help_text or "")
    target = new_text or (match.group(1) if match else None)
    action = _keyword(call, "action")
    switch = (_text(action) == "store_true" if action is not None and _text(action) is not None
              else getattr(action, "id", "") == "DeprecatedStoreTrueAction")
    # Only a switch replaced by one concrete word is translated; "--attn-dp-size <dp-size>" needs a
    # value gpuops cannot choose, and is left for the operator (the flag still parses).
    if target and switch and re.match(r"^--[a-z0-9-]+(=[A-Za-z0-9_.-]+)?$", target):
        replacements[flags[0]] = (target,)


def _field(node: ast.AnnAssign, names: set[str]) -> None:
    ann = node.annotation
    if not (isinstance(node.target, ast.Name) and isinstance(ann, ast.Subscript)):
        return
    head = ann.value
    if not (isinstance(head, ast.Name) and head.id in ("A", "Annotated")):
        return
    parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else []
    if len(parts) < 2:
        return
    meta = parts[1]
    cli = "--" + node.target.id.replace("_", "-")
    if isinstance(meta, ast.Call) and getattr(meta.func, "id", getattr(meta.func, "attr", "")) == "Arg":
        no_cli = _keyword(meta, "no_cli")
        if isinstance(no_cli, ast.Constant) and no_cli.value is True:
            return
        cli_name = _keyword(meta, "cli_name")
        cli = _text(cli_name) or cli if cli_name is not None else cli
        names.add(cli)
        aliases = _keyword(meta, "aliases")
        if isinstance(aliases, (ast.List, ast.Tuple)):
            names.update(t for t in (_text(e) for e in aliases.elts) if t)
    elif _text(meta) is not None:
        names.add(cli)


def release_flags(sources: Mapping[str, str]) -> AcceptedFlags:
    """Every ``--flag`` the release's server parser registers, from its argument sources."""
    names: set[str] = set()
    replacements: dict[str, tuple[str, ...]] = {}
    for path, text in sorted(sources.items()):
        try:
            tree = python_ast.parse(text, filename=path)
        except SyntaxError:
            continue  # written for a newer python than this one: its flags are not counted
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                _add_argument(node, names, replacements)
            elif isinstance(node, ast.AnnAssign):
                _field(node, names)
    if "--model-path" not in names or "--port" not in names:
        raise GpuopsError("the release's server arguments could not be read (no --model-path / --port found)")
    return AcceptedFlags(frozenset(names), replacements)


@frozen
class FlagCheck:
    """The inventory's launch flags checked against a release (``check_launch``): the deprecated ones to launch
    under their replacements, with a note for each."""

    renames: dict[str, tuple[str, ...]]   # flag -> replacement words, for the launch
    notes: tuple[str, ...]


def check_launch(args: Sequence[str], flags: AcceptedFlags, version: str, where: str) -> FlagCheck:
    """Every ``--flag`` of ``args`` against the release's parser: unknown ones refused (the closest
    name the release has), deprecated ones translated as the release itself says."""
    renames: dict[str, tuple[str, ...]] = {}
    notes: list[str] = []
    unknown: list[str] = []
    for word in args:
        text = str(word)
        if not text.startswith("--") or text == "--":
            continue
        name = text.split("=", 1)[0]
        if name not in flags.names:
            # argparse (allow_abbrev, on in every release's parser) takes a unique prefix: --tp
            prefixed = [n for n in flags.names if n.startswith(name)]
            if len(prefixed) == 1:
                name = prefixed[0]
        if name not in flags.names:
            close = difflib.get_close_matches(name, sorted(flags.names), n=1, cutoff=0.6)
            unknown.append(f"{name}" + (f" (closest it has: {close[0]})" if close else ""))
        elif name in flags.replacements and "=" not in text:
            renames[name] = flags.replacements[name]
            notes.append(f"{name} is deprecated in SGLang {version}: launched as {' '.join(flags.replacements[name])}, "
                         "as the release's own parser says")
    if unknown:
        raise GpuopsError(f"{where}: SGLang {version}'s server has no flag " + ", ".join(unknown)
                          + "; change sglang_args (nothing was changed)")
    return FlagCheck(renames, tuple(notes))


def drop_flags(args: Sequence[str], names: Iterable[Any]) -> list[str]:
    """``args`` without each ``--flag [value...]`` named in ``names`` (a Jinja filter of the launch:
    a run's part that takes an inventory flag out, such as tune's run without speculation)."""
    drop = {str(n).split("=", 1)[0] for n in names or ()}
    out: list[str] = []
    dropping = False
    for word in args:
        text = str(word)
        if text.startswith("--"):
            dropping = text.split("=", 1)[0] in drop
        if not dropping:
            out.append(text)
    return out


def rename_flags(args: Sequence[str], renames: Mapping[str, Sequence[str]]) -> list[str]:
    """``args`` with each renamed switch replaced by its words (a Jinja filter of the launch)."""
    out: list[str] = []
    for word in args:
        text = str(word)
        out.extend(renames[text] if text in renames else [text])
    return out


def merge_flags(*groups: Iterable[Any]) -> list[str]:
    """Launch flags merged left to right: a later ``--flag [value...]`` replaces the same flag's
    earlier occurrence in place (so a value is never doubled, and the order stays readable).
    Words before a group's first flag are kept as they are."""
    entries: list[list[str]] = []
    where: dict[str, int] = {}
    for group in groups:
        current: list[str] | None = None
        for arg in group or ():
            text = str(arg)
            if not text.startswith("--"):
                if current is None:
                    entries.append([text])
                else:
                    current.append(text)
                continue
            name = text.split("=", 1)[0]
            current = [text]
            if name in where:
                entries[where[name]] = current
            else:
                where[name] = len(entries)
                entries.append(current)
    return [word for entry in entries for word in entry]
