"""An independent search for every source line that reads a GPU capability: the yardstick the
gate scanner's recall is measured against (``benchmarks/gate_accuracy``).

Deliberately not the scanner: Python's ``tokenize`` over every file of the package, a line is a
*candidate* when one of its code tokens names a capability (a predicate such as ``is_sm100_supported``,
``get_device_capability``, ``get_device_sm``, ``CUDA_CAPABILITY``, ``.major``, an arch string
``"sm90"``, ...). Each candidate is then either *gate-shaped* (it compares or tests one) or excluded
with a reason (an import, a definition, a value stored for later, a message), by rules that read
tokens only.
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize
from pathlib import Path
from typing import Iterator
from gpuops.frozen import frozen

# Names that read the capability (case-insensitive, whole-token).
CAPABILITY_NAME_RE = re.compile(
    r"^_?(is_sm\d+\w*|is_blackwell\w*|is_hopper\w*|is_ampere\w*|get_device_capability|get_device_sm|"
    r"device_capability|compute_capability|cuda_capability|device_sm|get_jit_cuda_arch|_?sm_version|"
    r"is_sm\d+x)$", re.I)
ARCH_STRING_RE = re.compile(r"^[rbuf]*['\"]sm_?\d{2,3}[af]?['\"]$", re.I)
_PREFILTER = re.compile(rb"(?i)is_sm|blackwell|hopper|ampere|capability|device_sm|cuda_arch|sm_version|[\"']sm_?\d")
_COMPARE = {"==", "!=", "<", ">", "<=", ">="}
_SKIP_DIRS = ("__pycache__", "test", "tests")


@frozen
class Candidate:
    """A source line whose code names a GPU capability (found by tokens, not by the scanner): whether it is
    gate-shaped, and if not, why."""

    file: str
    line: int
    names: tuple[str, ...]
    shaped: bool           # a comparison or a test of a capability on this line
    reason: str | None     # why it is not a gate, when not shaped
    text: str


def package_files(root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(p in _SKIP_DIRS or p.startswith(".") for p in parts[:-1]):
            continue
        if parts[-1].startswith("test_") or parts[-1] == "conftest.py":
            continue
        yield rel, path


def candidates(root: Path) -> list[Candidate]:
    """Every candidate line of the package at ``root`` (the ``sglang`` dir)."""
    out: list[Candidate] = []
    for rel, path in package_files(root):
        data = path.read_bytes()
        if not _PREFILTER.search(data):
            continue
        out.extend(file_candidates(rel, data.decode("utf-8", "replace")))
    return out


def file_candidates(rel: str, text: str) -> list[Candidate]:
    lines = text.splitlines()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    by_line: dict[int, list[tokenize.TokenInfo]] = {}
    statement: list[tokenize.TokenInfo] = []
    statements: list[list[tokenize.TokenInfo]] = []
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            continue
        by_line.setdefault(tok.start[0], []).append(tok)
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if statement:
                statements.append(statement)
            statement = []
        else:
            statement.append(tok)
    stmt_of: dict[int, list[tokenize.TokenInfo]] = {}
    enclosing: dict[int, str | None] = {}  # line -> the innermost function it is in
    defs: list[tuple[int, str]] = []       # (column, name) of the functions open here
    for stmt in statements:
        col = stmt[0].start[1]
        while defs and defs[-1][0] >= col:
            defs.pop()
        inner = defs[-1][1] if defs else None
        for tok in stmt:
            stmt_of.setdefault(tok.start[0], stmt)
            enclosing.setdefault(tok.start[0], inner)
        words = [t.string for t in stmt[:3]]
        if "def" in words[:2]:
            name = words[words.index("def") + 1] if words.index("def") + 1 < len(words) else "?"
            defs.append((col, name))
    out = []
    for number in sorted(by_line):
        toks = [t for t in by_line[number] if t.type in (tokenize.NAME, tokenize.STRING, tokenize.OP)]
        names = [t.string for t in toks if t.type == tokenize.NAME and CAPABILITY_NAME_RE.match(t.string)]
        names += [t.string for t in toks if t.type == tokenize.NAME and t.string.lower() == "major"
                  and _attr_of_capability(toks, t)]
        arch = [t.string for t in toks if t.type == tokenize.STRING and ARCH_STRING_RE.match(t.string)]
        if not names and not arch:
            continue
        stmt = stmt_of.get(number, toks)
        shaped, reason = classify(stmt, toks, names, arch)
        inside = enclosing.get(number)
        if shaped and inside and _PREDICATE_RE.match(inside):
            shaped, reason = False, f"inside the definition of the predicate {inside} (judged where it is used)"
        elif shaped and stmt and stmt[0].start[1] == 0 and _is_module_alias(stmt):
            shaped, reason = False, "a module-level alias of a test (judged where it is used)"
        out.append(Candidate(rel, number, tuple(names + arch), shaped, reason,
                             lines[number - 1].strip()[:160] if number - 1 < len(lines) else ""))
    return out


def _call_argument(toks: list[tokenize.TokenInfo], tok: tokenize.TokenInfo) -> bool:
    i = toks.index(tok)
    before = toks[i - 1].string if i else ""
    after = toks[i + 1].string if i + 1 < len(toks) else ""
    return before in ("(", ",") and after in (")", ",")


def _attr_of_capability(toks: list[tokenize.TokenInfo], tok: tokenize.TokenInfo) -> bool:
    """``x.major`` where x names a capability (``cap.major``, ``capability.major``, ``arch.major``)."""
    i = toks.index(tok)
    if i < 2 or toks[i - 1].string != ".":
        return False
    base = toks[i - 2].string.lower()
    return bool(re.search(r"cap|arch|props|properties|\)$", base)) or toks[i - 2].string == ")"


def classify(stmt: list[tokenize.TokenInfo], line_toks: list[tokenize.TokenInfo], names: list[str],
             arch: list[str]) -> tuple[bool, str | None]:
    """(gate-shaped, why not). Reads tokens only."""
    words = [t.string for t in stmt]
    first = words[0] if words else ""
    if first in ("import", "from"):
        return False, "import"
    if first in ("def", "class", "@"):
        return False, "definition line (name or decorator)"
    if first in ("global", "nonlocal", "del"):
        return False, "declaration"
    line_words = [t.string for t in line_toks]
    has_compare = any(w in _COMPARE for w in line_words) or "in" in line_words or "is" in line_words
    boolean_ctx = first in ("if", "elif", "while", "assert", "return") or any(
        w in ("and", "or", "not", "if", "else") for w in line_words)
    called = _predicate_used(line_toks)
    if arch and not names and all(_call_argument(line_toks, t) for t in line_toks
                                  if t.type == tokenize.STRING and ARCH_STRING_RE.match(t.string)):
        return False, "an architecture name passed to a call (a constant, not this GPU)"
    if has_compare and (names or arch):
        if "is" in line_words and not any(w in _COMPARE for w in line_words) and "in" not in line_words:
            return False, "`is None` test: asks whether there is a GPU, not which one"
        return True, None
    if called and (boolean_ctx or "=" in line_words or "(" in line_words):
        if first not in ("if", "elif", "while", "assert", "return") and "=" in words and not boolean_ctx:
            target = words[: words.index("=")]
            if len(target) == 1 or (len(target) == 3 and target[1] == "."):
                return True, None  # `flag = is_sm100_supported()`: a stored test
        return True, None
    if "=" in words and not has_compare:
        return False, "a capability value stored (judged where it is compared)"
    if any(t.type == tokenize.STRING for t in line_toks) and not called:
        return False, "in a message or string"
    if "(" in line_words and not called:
        return False, "a capability value passed to a call (judged where it is compared)"
    return False, "mentions a capability without testing it"


_PREDICATE_RE = re.compile(r"^_?is_(sm\d+\w*|blackwell\w*|hopper\w*|ampere\w*)$", re.I)


def _is_module_alias(stmt: list[tokenize.TokenInfo]) -> bool:
    """``_is_sm100 = is_cuda() and is_sm100_supported()`` (one name, assigned once at column 0)."""
    words = [t.string for t in stmt]
    return len(words) > 2 and stmt[0].type == tokenize.NAME and words[1] in ("=", ":") and "=" in words


def _predicate_used(toks: list[tokenize.TokenInfo]) -> bool:
    for tok in toks:
        if tok.type == tokenize.NAME and re.match(r"^_?is_(sm\d+\w*|blackwell\w*|hopper\w*|ampere\w*)$", tok.string, re.I):
            return True
    return False


__all__ = ["Candidate", "candidates", "file_candidates", "package_files", "keyword"]
