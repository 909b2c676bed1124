"""gpuops gate scanner: find every GPU-generation gate in an installed SGLang, without importing it.

Runs on the host with the python of the host's SGLang install (stdlib only, Python 3.8+). Shipped
on stdin (``python - '<options JSON>'``) or run as a file (``python3 gate_scan.py '<options>'``);
prints ONE JSON document on stdout and always exits 0 (a problem is a ``"reason"``, not a crash).

A *gate* is a boolean expression that tests the GPU generation: a predicate call
(``is_sm100_supported()``), a module alias of one (``_is_sm100_supported``), a platform attribute
(``get_platform().is_sm100``) or a device-capability comparison (``get_device_capability()[0] >= 9``),
in an ``if``/``elif``/``while``/``assert``, a ``return``, an assignment or any other expression.
For each the scanner reports its condition as a small tree (and/or/not over capability atoms and
opaque clauses, with exact source spans), where it is, what it guards (raise message, returned
value, fields it sets) and an excerpt. It also reads what the predicates mean from their
definitions (``partial(_check_cuda_device_version, device_capability_majors=[12], ...)``, small
``def is_x(): return ...`` bodies, platform attribute tables). Judging against a host's GPU is
done by gpuops, not here.

Speed: a large release is ~70 MB of Python. Files are filtered by plain substring search, then only
the top-level statements (or class members) that mention a capability token are parsed; a file
whose pieces do not parse on their own is parsed whole.
"""

import ast
import bisect
import itertools
import json
import os
import pickle
import re
import struct
import sys
import time

SCANNER_VERSION = 1

# Substrings that every capability gate (or a predicate definition) contains somewhere.
# Upper-case spellings too (``_IS_SM120 = is_sm120_supported()``, ``CUDA_CAPABILITY = ...``): a
# module constant is used in lines that hold no lower-case token at all.
TOKENS = ("is_sm", "blackwell", "hopper", "capability", "device_sm", "cuda_arch",
          "IS_SM", "BLACKWELL", "HOPPER", "CAPABILITY", "DEVICE_SM")
PRED_NAME_RE = re.compile(r"^_?is_(sm\d+\w*|blackwell\w*|hopper\w*|ampere\w*)$")
PLATFORM_NAME_RE = re.compile(r"^_?is_(cuda|cuda_alike|hip|npu|xpu|cpu|musa|mps|hpu)(_static|_runtime)?$")
# Calls whose value is the capability (an object or tuple with major/minor): torch's, SGLang's
# wrappers of it, the JIT kernels' arch info.
CC_FUNCS = ("get_device_capability", "get_jit_cuda_arch")
PROPS_FUNCS = ("get_device_properties",)  # an object with .major/.minor
SM_FUNCS = ("get_device_sm",)
CUDA_VERSION_FUNCS = ("get_cuda_version", "_get_cuda_version")
SKIP_DIRS = ("__pycache__", "test", "tests")
EXCERPT_MAX_LINES = 12
TEXT_MAX = 400
_ASSIGN_NAME_RE = re.compile(r"^([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")
_PLATFORM_TEXT_RE = re.compile(r"\bis_(cuda|cuda_alike|hip|npu|xpu|cpu|musa|mps|hpu)\b")
_IDENT_RE = re.compile(r"^[A-Za-z_]\w{2,80}$")
_COL0_RE = re.compile(r"^[^\s#)\]}]", re.M)
_CONTINUATION_RE = re.compile(r"^(else|elif|except|finally)\b")


# ---------------------------------------------------------------- options and package discovery

def read_options(argv):
    if len(argv) > 1 and argv[1].strip():
        try:
            opts = json.loads(argv[1])
        except ValueError:
            return None, "options are not JSON"
        if not isinstance(opts, dict):
            return None, "options are not a JSON object"
        return opts, None
    return {}, None


def find_sglang(opts):
    root = opts.get("root")
    if root:
        root = os.path.abspath(root)
        if not os.path.isfile(os.path.join(root, "__init__.py")):
            return None, "no sglang package at %s" % root
        return root, None
    try:
        import importlib.util

        spec = importlib.util.find_spec("sglang")  # finds without importing it
    except Exception as exc:  # a broken sys.path entry must not crash the probe
        return None, "cannot look for sglang: %s" % exc
    if spec is None or not spec.submodule_search_locations:
        return None, "sglang is not installed for %s" % sys.executable
    for location in spec.submodule_search_locations:
        if os.path.isfile(os.path.join(location, "__init__.py")):
            return os.path.abspath(location), None
    return None, "sglang at %s is not a regular package" % list(spec.submodule_search_locations)


def find_version(root):
    site = os.path.dirname(root)
    try:
        for name in sorted(os.listdir(site)):
            low = name.lower()
            if low.startswith("sglang-") and (low.endswith(".dist-info") or low.endswith(".egg-info")):
                meta = os.path.join(site, name, "METADATA" if low.endswith(".dist-info") else "PKG-INFO")
                try:
                    with open(meta, encoding="utf-8", errors="replace") as handle:
                        for line in handle:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break
                except OSError:
                    pass
    except OSError:
        pass
    try:
        with open(os.path.join(root, "version.py"), encoding="utf-8", errors="replace") as handle:
            match = re.search(r"__version__\s*=\s*[\"']([^\"']+)", handle.read())
            if match:
                return match.group(1)
    except OSError:
        pass
    return None


def walk_python_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py") and not name.startswith("test_") and name != "conftest.py":
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root).replace(os.sep, "/"), path


# ---------------------------------------------------------------- splitting a file into pieces

class Piece(object):
    """A run of source lines parsed on its own: ``line0`` lines down, ``indent`` columns in."""

    __slots__ = ("line0", "indent", "tree", "qual", "in_class")

    def __init__(self, line0, indent, tree, qual, in_class):
        self.line0 = line0
        self.indent = indent
        self.tree = tree
        self.qual = qual
        self.in_class = in_class


def segment_starts(lines, indent, text=None):
    """Indexes of lines that look like they begin a statement at exactly ``indent`` (a cheap guess;
    lines inside triple-quoted strings are merged back by ``merge_string_runs``)."""
    width = len(indent)
    if text is not None and not width:
        # The usual case, a whole module: let the regex engine find column-0 code lines.
        candidates = [match.start() for match in _COL0_RE.finditer(text)]
        if not candidates:
            return []
        offsets = [0] + list(itertools.accumulate(map(len, lines)))
        indexes = [bisect.bisect_right(offsets, c) - 1 for c in candidates]
    else:
        indexes = [i for i, line in enumerate(lines) if line.startswith(indent)
                   and line[width:width + 1] not in ("", " ", "\t", "\r", "\n", "#", ")", "]", "}")]
    starts = []
    prev_decorator = False
    for i in indexes:
        rest = lines[i][width:]
        if _CONTINUATION_RE.match(rest):
            continue
        if prev_decorator:
            prev_decorator = rest.startswith("@")
            continue
        starts.append(i)
        prev_decorator = rest.startswith("@")
    return starts


class FileSource(object):
    def __init__(self, rel, text):
        self.rel = rel
        self.text = text
        self.lines = text.splitlines(True)
        self._offsets = None
        self._quotes = None
        self.word_lines = []

    def offset_of_line(self, index):
        if self._offsets is None:
            self._offsets = [0] + list(itertools.accumulate(map(len, self.lines)))
        return self._offsets[index]

    def mark_words(self, words):
        """Remember which lines mention any of ``words`` (str.find is fast; a regex is not)."""
        marked = set()
        text = self.text
        for word in words:
            start = text.find(word)
            while start != -1:
                marked.add(start)
                start = text.find(word, start + len(word))
        self.offset_of_line(0)
        offsets = self._offsets
        self.word_lines = sorted({bisect.bisect_right(offsets, offset) for offset in marked})

    def mentions_words(self, first_line, last_line):
        lines = self.word_lines
        i = bisect.bisect_left(lines, first_line)
        return i < len(lines) and lines[i] <= last_line

    def inside_triple_quote(self, index):
        """Is line ``index`` (0-based) inside a triple-quoted string? By parity of the quotes before
        it: a quote inside a comment can fool it, which only makes a piece larger, never wrong."""
        if self._quotes is None:
            self._quotes = (find_all(self.text, '"""'), find_all(self.text, "'''"))
        end = self.offset_of_line(index)
        return any(bisect.bisect_left(found, end) % 2 == 1 for found in self._quotes)


def find_all(text, needle):
    found = []
    start = text.find(needle)
    while start != -1:
        found.append(start)
        start = text.find(needle, start + len(needle))
    return found


def merge_string_runs(source, starts, end, base=0):
    """(begin, end) line ranges, one a statement: a 'start' inside a string joins the one before."""
    ranges = []
    for begin, stop in zip(starts, starts[1:] + [end]):
        if ranges and source.inside_triple_quote(base + begin):
            ranges[-1][1] = stop
        else:
            ranges.append([begin, stop])
    return ranges


# "capability" is also an English word ("compute capability 9.0" in a docstring): a piece whose only
# token it is must use it as code (`device_capability`, `capability[0]`, `capability.major`, ...).
_CAPABILITY_CODE_RE = re.compile(r"\wcapability|capability\w|capability\s*[\[(.=<>!,):]")


def has_token(text, extra_names):
    for token in TOKENS:
        if token in text:
            if token != "capability" or _CAPABILITY_CODE_RE.search(text):
                return True
    for name in extra_names:
        if name in text:
            return True
    return False


def split_pieces(source, extra_names, skip=()):
    """Parse only the top-level statements (or long classes' members) that may matter.

    Raises SyntaxError when a piece does not parse on its own (the caller parses the whole file).
    ``skip``: first lines of pieces already parsed (a second pass adds only new ones).
    """
    lines = source.lines
    starts = segment_starts(lines, "", source.text)
    if not starts:
        return []
    pieces = []
    for begin, end in merge_string_runs(source, starts, len(lines)):
        chunk_lines = lines[begin:end]
        head = chunk_lines[0]
        chunk = "".join(chunk_lines)
        wanted = has_token(chunk, extra_names) or (
            _ASSIGN_NAME_RE.match(head) and len(chunk_lines) < 8 and _PLATFORM_TEXT_RE.search(chunk))
        if not wanted:
            continue
        is_class = head.startswith("class ") or (head.startswith("@") and re.search(r"^class\s", chunk, re.M))
        if is_class and len(chunk_lines) > 150:
            members = split_class(source, begin, end, extra_names, skip)
            if members is not None:
                pieces.extend(members)
                continue
        if begin in skip:
            continue
        pieces.append(Piece(begin, 0, ast.parse(chunk), "", False))
    return pieces


def split_class(source, begin, end, extra_names, skip):
    """A long class: parse only the members that mention a token. None: parse it whole."""
    lines = source.lines
    header_end = begin
    while header_end < end and not re.match(r"^class\s", lines[header_end]):
        header_end += 1
    match = re.match(r"^class\s+([A-Za-z_]\w*)", lines[header_end]) if header_end < end else None
    if match is None:
        return None
    class_name = match.group(1)
    # The header may span lines (`class X(\n    Base,\n):`): it ends where its brackets close.
    depth = 0
    body_start = None
    for index in range(header_end, min(end, header_end + 30)):
        code = lines[index].split("#", 1)[0]
        depth += code.count("(") + code.count("[") - code.count(")") - code.count("]")
        if depth <= 0 and code.rstrip().endswith(":"):
            body_start = index + 1
            break
    if body_start is None:
        return None
    body = lines[body_start:end]
    indent = None
    for line in body:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            indent = line[: len(line) - len(line.lstrip())]
            break
    if not indent:
        return None
    width = len(indent)
    pieces = []
    for rb, re_ in merge_string_runs(source, segment_starts(body, indent), len(body), body_start):
        chunk_lines = body[rb:re_]
        absolute = body_start + rb
        if absolute in skip or not has_token("".join(chunk_lines), extra_names):
            continue
        # Lines indented less than the member (inside a string or brackets) lose what they have:
        # only the structure matters here, and spans are read from the file's own lines.
        dedented = [line[width:] if line.startswith(indent) else line.lstrip(" \t") for line in chunk_lines]
        pieces.append(Piece(absolute, width, ast.parse("".join(dedented)), class_name, True))
    return pieces


# ---------------------------------------------------------------- locating and quoting nodes

class Locator(object):
    """Turns a piece's node positions into file positions (1-based lines, character columns)."""

    def __init__(self, source, piece):
        self.source = source
        self.line0 = piece.line0
        self.indent = piece.indent

    def _col(self, lineno, byte_col):
        line = self.source.lines[lineno - 1] if lineno - 1 < len(self.source.lines) else ""
        if line.isascii() if hasattr(line, "isascii") else all(ord(c) < 128 for c in line):
            return byte_col + self.indent
        body = line[self.indent:].encode("utf-8")
        return len(body[:byte_col].decode("utf-8", "replace")) + self.indent

    def span(self, node):
        line = node.lineno + self.line0
        end_line = getattr(node, "end_lineno", None)
        end_col = getattr(node, "end_col_offset", None)
        if end_line is None:
            end_line, end_col_chars = line, None
        else:
            end_line += self.line0
            end_col_chars = self._col(end_line, end_col)
        return [line, self._col(line, node.col_offset), end_line, end_col_chars]

    def text(self, node, limit=TEXT_MAX):
        line, col, end_line, end_col = self.span(node)
        lines = self.source.lines
        if end_col is None:
            out = lines[line - 1][col:].rstrip("\n")
        elif line == end_line:
            out = lines[line - 1][col:end_col]
        else:
            parts = [lines[line - 1][col:]] + lines[line:end_line - 1] + [lines[end_line - 1][:end_col]]
            out = "".join(parts)
        out = " ".join(out.split())
        return out if len(out) <= limit else out[: limit - 3] + "..."

    def excerpt(self, first_line, last_line):
        last_line = min(last_line, first_line + EXCERPT_MAX_LINES - 1, len(self.source.lines))
        return "".join(self.source.lines[first_line - 1:last_line]).rstrip("\n")


# ---------------------------------------------------------------- small AST helpers

def dotted(node):
    """``get_exec().comm.x`` -> "get_exec().comm.x", ``f(view)`` -> "f(...)", ``a.b[0]`` -> "a.b[0]";
    None when the node is not a plain reference."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else base + "." + node.attr
    if isinstance(node, ast.Call):
        base = dotted(node.func)
        if base is None:
            return None
        return base + ("()" if not node.args and not node.keywords else "(...)")
    if isinstance(node, ast.Subscript):
        base = dotted(node.value)
        index = node.slice.value if isinstance(node.slice, _INDEX) else node.slice
        key = literal(index)
        if base is None or key is _NO_VALUE or not isinstance(key, (int, str)):
            return None
        return "%s[%r]" % (base, key)
    return None


def last_name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return last_name(node.func)
    return None


def literal(node):
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.Call) and last_name(node.func) in ("frozenset", "set", "tuple", "list") and len(node.args) == 1:
            return literal(node.args[0])
        return _NO_VALUE
    return jsonable(value)


_NO_VALUE = object()
_INDEX = getattr(ast, "Index", ())


def jsonable(value):
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def string_of(node):
    """The text of a message argument: constants kept, formatted parts shown as {...}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = string_of(node.left)
        right = string_of(node.right) if isinstance(node.op, ast.Add) else ""
        if left is not None:
            return left + (right or "")
    return None


CMP_OPS = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}


def version_tuple(value):
    if isinstance(value, str):
        parts = re.findall(r"\d+", value)
        return [int(p) for p in parts[:2]] if parts else None
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return value[:2]
    return None


# ---------------------------------------------------------------- per-file knowledge

class FileInfo(object):
    def __init__(self, source):
        self.source = source
        self.rel = source.rel
        self.pieces = []
        self.imports = {}          # local name -> (module, name)
        self.aliases = {}          # name -> (value node, locator)  module-level
        self.predicates = {}       # name -> meaning dict (a class method's has "cls")
        self.helpers = set()       # functions used as partial(...) targets: predicate machinery
        self.platform_map = {}     # attr -> predicate name
        self.cc_vars = {}          # module-level name -> capability subject ("cc", "major", "sm", ...)
        self.cc_funcs = {}         # module-level function -> the capability subject it returns
        self.module_names = {}     # name bound by `import x` / `import x.y as z` -> module
        self.star_imports = []     # modules of `from m import *`
        self.self_cc = None        # `self.X` -> subject, from the file's methods (computed when walked)
        self.error = None
        self.whole = False         # parsed as one piece

    @property
    def module(self):
        parts = self.rel[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ["sglang"] + parts

    @property
    def top(self):
        """The file's top-level subpackage (srt, multimodal_gen, jit_kernel, ...): a name defined
        in both means what its own subpackage says."""
        return self.rel.split("/", 1)[0]


def parse_file(info, extra_names):
    """Fill ``info.pieces`` (a second call with more names adds only the pieces not parsed yet)."""
    if info.whole:
        return
    skip = {piece.line0 for piece in info.pieces}
    try:
        info.pieces = info.pieces + split_pieces(info.source, extra_names, skip)
        return
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    try:
        tree = ast.parse(info.source.text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None)
        info.error = "%s%s" % (type(exc).__name__, (" at line %s" % line) if line else "")
        info.pieces = []
        return
    info.pieces = [Piece(0, 0, tree, "", False)]
    info.whole = True


def load_info(info, extra_names):
    """Parse (more of) ``info`` and collect its definitions afresh."""
    parse_file(info, extra_names)
    if info.error:
        return
    info.imports, info.aliases, info.predicates, info.helpers, info.platform_map = {}, {}, {}, set(), {}
    collect_definitions(info)


_IMPORT_RE = re.compile(r"^[ \t]*import[ \t]+([\w.]+)(?:[ \t]+as[ \t]+(\w+))?", re.M)


def collect_definitions(info):
    # `import x.y as z` lines hold no token, so their pieces are not parsed: read them as text.
    for match in _IMPORT_RE.finditer(info.source.text):
        if match.group(2):
            info.module_names[match.group(2)] = match.group(1)
        else:
            info.module_names[match.group(1).split(".")[0]] = match.group(1).split(".")[0]
    for piece in info.pieces:
        locator = Locator(info.source, piece)
        if piece.in_class:
            for stmt in piece.tree.body:
                collect_class_member(info, stmt, locator, piece.qual)
        else:
            for stmt in piece.tree.body:
                collect_module_statement(info, stmt, locator)
    # `from x import y` inside functions (deferred imports): the same names, where the module
    # does not bind them itself.
    for piece in info.pieces:
        for func in functions_in(piece.tree.body):
            for stmt in statements(func.body):
                if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                    for alias in stmt.names:
                        name = alias.asname or alias.name
                        if alias.name != "*" and name not in info.imports and name not in info.aliases:
                            info.imports[name] = (stmt.module, alias.name)


def module_scope(info, locator=None):
    return Scope(None, info, locator)


def collect_module_statement(info, stmt, locator, nested=False):
    """Definitions at module level. ``nested``: inside a module-level ``if``/``try`` (only imports
    and capability values are taken from there: a predicate or alias defined twice is ambiguous)."""
    if isinstance(stmt, ast.ImportFrom):
        module = resolve_relative(info, stmt.module, stmt.level)
        for alias in stmt.names:
            if alias.name != "*":
                info.imports[alias.asname or alias.name] = (module, alias.name)
            elif module not in info.star_imports:
                info.star_imports.append(module)
    elif isinstance(stmt, ast.Import):
        for alias in stmt.names:
            info.module_names[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or alias.name.split(".")[0]
    elif isinstance(stmt, (ast.If, ast.Try)) or (hasattr(ast, "TryStar") and isinstance(stmt, ast.TryStar)):
        blocks = [stmt.body, stmt.orelse, getattr(stmt, "finalbody", [])]
        blocks += [h.body for h in getattr(stmt, "handlers", [])]
        for block in blocks:
            for inner in block:
                collect_module_statement(info, inner, locator, nested=True)
    elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if stmt.value is None:
            return
        if collect_cc_assignment(info.cc_vars, targets, stmt.value, module_scope(info, locator)):
            return
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not names or nested:
            return
        meaning = meaning_from_partial(stmt.value, info)
        if meaning is not None:
            for name in names:
                info.predicates[name] = dict(meaning, line=stmt.lineno + locator.line0, source=locator.text(stmt.value, 200))
            return
        if isinstance(stmt.value, ast.Name) and PRED_NAME_RE.match(names[0]) and PRED_NAME_RE.match(stmt.value.id):
            for name in names:
                info.predicates[name] = {"same_as": stmt.value.id, "line": stmt.lineno + locator.line0, "source": stmt.value.id}
            return
        if isinstance(stmt.value, ast.Dict):
            mapping = {}
            for key, value in zip(stmt.value.keys, stmt.value.values):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Constant)
                        and isinstance(value.value, str) and PRED_NAME_RE.match(key.value)):
                    mapping[key.value] = value.value
            if mapping:
                info.platform_map.update(mapping)
                return
        for name in names:
            info.aliases[name] = (stmt.value, locator)
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and not nested:
        collect_function(info, stmt, locator, None)
    elif isinstance(stmt, ast.ClassDef) and not nested:
        for member in stmt.body:
            collect_class_member(info, member, locator, stmt.name)


def collect_class_member(info, stmt, locator, cls):
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and PRED_NAME_RE.match(stmt.name):
        existing = info.predicates.get(stmt.name)
        if existing is None or existing.get("cls"):
            collect_function(info, stmt, locator, cls)


def collect_cc_assignment(table, targets, value, scope):
    """``X = get_device_capability()``, ``major, minor = ...``, ``X = cap[0]``, ``X = major * 10 + minor``:
    record X's capability subject in ``table``. True when it was one."""
    if len(targets) != 1:
        return False
    target = targets[0]
    subject = cc_subject(value, scope)
    if isinstance(target, ast.Name) and subject is not None:
        remember_subject(table, target.id, subject)
        return True
    if isinstance(target, (ast.Tuple, ast.List)) and subject == "cc" and len(target.elts) == 2:
        for elt, part in zip(target.elts, ("major", "minor")):
            if isinstance(elt, ast.Name):
                remember_subject(table, elt.id, part)
        return True
    if (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)):
        found = False
        for elt, part in zip(target.elts, value.elts):
            sub = cc_subject(part, scope)
            if isinstance(elt, ast.Name) and sub is not None:
                remember_subject(table, elt.id, sub)
                found = True
        return found
    return False


def remember_subject(table, name, subject):
    """Two different capability values under one name make it unreadable (None), not a guess."""
    if name.strip("_") == "":
        return  # `major, _ = ...`: the throwaway name carries nothing
    if name in table and table[name] != subject:
        table[name] = None
    else:
        table[name] = subject


def predicate_body(func):
    """The statements of a short function that may define a predicate or a capability value:
    docstring dropped; None when it is not short and plain (imports, assignments, early returns,
    one final return)."""
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(getattr(s, "value", None), ast.Constant))]
    last = body[-1] if body else None
    if (isinstance(last, ast.Try) and last.handlers and not last.orelse and not last.finalbody
            and all(h.body and isinstance(h.body[-1], ast.Return) and literal_return(h.body[-1]) is False
                    for h in last.handlers)):
        body = body[:-1] + last.body  # `try: return <test>` / `except ...: return False`: the test where it runs
    if not body or len(body) > 6 or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    for stmt in body[:-1]:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
            continue
        if (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1
                and isinstance(stmt.body[0], ast.Return) and literal_return(stmt.body[0]) in (True, False)):
            continue
        return None
    return body


def literal_return(stmt):
    """True/False for `return True`/`return False|None|`; None for anything else."""
    if stmt.value is None:
        return False
    value = literal(stmt.value)
    if value is True:
        return True
    if value is False or value is None:
        return False
    return None


def collect_function(info, func, locator, cls):
    body = predicate_body(func)
    if body is None:
        return
    value = body[-1].value
    local_cc = {}
    scope = Scope(None, info, locator, None, local_cc)
    for stmt in body[:-1]:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            collect_cc_assignment(local_cc, stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target], stmt.value, scope)
    if cls is None:
        subject = cc_subject(value, scope)
        if subject is not None and not isinstance(value, (ast.Compare, ast.BoolOp)):
            info.cc_funcs[func.name] = subject  # a capability value (`return major * 10 + minor`)
            return
    if PRED_NAME_RE.match(func.name) or pure_capability(value, local_cc):
        entry = {
            "def_node": (func, body, locator),
            "line": func.lineno + locator.line0,
            "source": locator.text(value, 300),
        }
        if cls is not None:
            entry["cls"] = cls
        info.predicates[func.name] = entry


def resolve_relative(info, module, level):
    if not level:
        return module or ""
    base = info.module
    if not info.rel.endswith("__init__.py"):
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def meaning_from_partial(value, info):
    """``lru_cache(...)(partial(_check, device_capability_majors=[12], cuda_version=(12, 8)))``."""
    for node in ast.walk(value):
        if not isinstance(node, ast.Call) or last_name(node.func) != "partial" or not node.args:
            continue
        majors = None
        cuda = None
        for kw in node.keywords:
            val = literal(kw.value)
            if kw.arg and "major" in kw.arg and isinstance(val, list):
                majors = [v for v in val if isinstance(v, int)]
            elif kw.arg and "cuda" in kw.arg:
                cuda = version_tuple(val)
        positional = [literal(a) for a in node.args[1:]]
        if majors is None and positional and isinstance(positional[0], list):
            majors = [v for v in positional[0] if isinstance(v, int)]
            if len(positional) > 1:
                cuda = version_tuple(positional[1])
        if majors is not None:
            helper = last_name(node.args[0])
            if helper:
                info.helpers.add(helper)
            return {"majors": majors, "min_cuda": cuda}
    return None


def pure_capability(node, local_cc=None):
    """Is this expression about the GPU and nothing else (so its function is a predicate)?"""
    local_cc = local_cc or {}
    if isinstance(node, ast.BoolOp):
        return all(pure_capability(v, local_cc) for v in node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return pure_capability(node.operand, local_cc)
    if isinstance(node, ast.Compare):
        operands = [node.left] + list(node.comparators)
        if not any(mentions_device(o, local_cc) for o in operands):
            return False
        return all(mentions_device(o, local_cc) or literal(o) is not _NO_VALUE or isinstance(o, ast.Name) for o in operands)
    name = last_name(node) if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) else None
    return bool(name and (PRED_NAME_RE.match(name) or PLATFORM_NAME_RE.match(name)))


def mentions_device(node, local_cc=None):
    for sub in ast.walk(node):
        if local_cc and isinstance(sub, ast.Name) and local_cc.get(sub.id):
            return True
        name = last_name(sub) if isinstance(sub, (ast.Name, ast.Attribute, ast.Call)) else None
        if name and (name in CC_FUNCS or name in SM_FUNCS):
            return True
        if isinstance(sub, ast.Attribute) and (dotted(sub) or "").endswith("version.cuda"):
            return True
    return False


# ---------------------------------------------------------------- the condition tree

class Scope(object):
    """What names mean where a condition is read: the file, plus a function's local aliases."""

    def __init__(self, scanner, info, locator, local_aliases=None, cc_vars=None, fn=None):
        self.scanner = scanner
        self.info = info
        self.locator = locator
        self.local_aliases = {} if local_aliases is None else local_aliases
        self.cc_vars = {} if cc_vars is None else cc_vars
        self.fn = fn            # the FunctionContext read in (its parameters and local names)
        self.param_flow = False  # set while reading a comparison with a capability-like literal
        self.nested = []        # boolean roots found inside opaque clauses
        self.requires = []      # capability tests the statement needs to get past (table lookups)
        self.expanding = set()  # alias names being expanded (cycles)

    def shadowed(self, name):
        """A parameter or local of the function, which is not what the module's name means."""
        fn = self.fn
        return fn is not None and name in fn.shadow and name not in self.local_aliases and name not in self.cc_vars

    def imported(self, name, table):
        """What ``name``, imported from another module of the tree, is in that module's ``table``
        ("vars" or "funcs"), or None."""
        if self.scanner is None or name not in self.info.imports:
            return None
        module, original = self.info.imports[name]
        for rel in module_files(module):
            entry = self.scanner.cc_tables.get(rel)
            if entry and original in entry[table]:
                return entry[table][original]
        return None


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
        if value is _NO_VALUE and isinstance(right, ast.Name):
            value = scope.scanner.constant(scope.info, right.id)
        if ref is not None:
            out["ref"] = ref
            out["cmp"] = CMP_OPS.get(type(node.ops[0]), "?")
            if value is not _NO_VALUE:
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
    for child in ast.iter_child_nodes(node):
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


def cc_subject(node, scope):
    """What a compared expression is, as data flow from the device: "cc" (the capability tuple or
    object), "major", "minor", "sm" (major * 10 + minor), "fmt:<template>" (a string formatted from
    them, e.g. "fmt:sm{major}{minor}"), or None."""
    if isinstance(node, ast.Call):
        name = last_name(node.func)
        if name in CC_FUNCS or name in PROPS_FUNCS:
            return "cc"
        if name in SM_FUNCS:
            return "sm"
        if name == "to_int" and isinstance(node.func, ast.Attribute) and cc_subject(node.func.value, scope) == "cc":
            return "sm"  # a capability object's `to_int()` is major * 10 + minor
        if name == "int" and len(node.args) == 1 and not node.keywords:
            return cc_subject(node.args[0], scope)
        if isinstance(node.func, ast.Name) and not scope.shadowed(node.func.id):
            found = scope.info.cc_funcs.get(node.func.id) or scope.imported(node.func.id, "funcs")
            if found:
                return found  # a small function of the tree returning a capability value
        return None
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        if [cc_subject(e, scope) for e in node.elts] == ["major", "minor"]:
            return "cc"
        return None
    if isinstance(node, ast.IfExp):
        # `get_device_capability() if torch.cuda.is_available() else None`: the capability where
        # there is a GPU (None elsewhere is what `is not None` tests).
        # `... if dev.type == "cuda" else (0, 0)`: a literal is the no-GPU fallback.
        sides = [cc_subject(b, scope) if literal(b) is _NO_VALUE else "none" for b in (node.body, node.orelse)]
        kinds = set(sides) - {"none"}
        return kinds.pop() if len(kinds) == 1 and None not in kinds else None
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            table = self_subjects(scope)
            if node.attr in table:
                return table[node.attr]  # `self.x = get_device_capability()[0]`: what it was set to
        if node.attr in ("major", "minor"):
            return node.attr if cc_subject(node.value, scope) == "cc" else None
        if node.attr in ("device_capability", "device_sm"):
            return "cc" if node.attr == "device_capability" else "sm"
        return None
    if isinstance(node, ast.Name):
        name = node.id
        if name in scope.cc_vars:
            return scope.cc_vars[name]
        if scope.shadowed(name):
            if scope.param_flow and scope.scanner is not None and name in scope.fn.params:
                return scope.scanner.param_subject(scope.info, scope.fn, name)
            return None
        if name in scope.info.cc_vars:
            return scope.info.cc_vars[name]
        return scope.imported(name, "vars")
    if isinstance(node, ast.Subscript):
        base = cc_subject(node.value, scope)
        index = node.slice
        if isinstance(index, _INDEX):  # Python 3.8 wraps subscripts
            index = index.value
        idx = literal(index)
        if base == "cc" and idx in (0, 1):
            return "major" if idx == 0 else "minor"
        return None
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.FloorDiv):
            if cc_subject(node.left, scope) == "sm" and literal(node.right) == 10:
                return "major"
        elif isinstance(node.op, ast.Mod):
            if cc_subject(node.left, scope) == "sm" and literal(node.right) == 10:
                return "minor"
        elif isinstance(node.op, ast.Add):
            # major * 10 + minor, in either order
            for tens, ones in ((node.left, node.right), (node.right, node.left)):
                if (isinstance(tens, ast.BinOp) and isinstance(tens.op, ast.Mult) and cc_subject(ones, scope) == "minor"
                        and 10 in (literal(tens.left), literal(tens.right))
                        and "major" in (cc_subject(tens.left, scope), cc_subject(tens.right, scope))):
                    return "sm"
        return None
    if isinstance(node, ast.JoinedStr):
        template = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                template.append(part.value.replace("{", "{{").replace("}", "}}"))
            elif isinstance(part, ast.FormattedValue) and part.format_spec is None and part.conversion in (-1, None):
                sub = cc_subject(part.value, scope)
                if sub not in ("major", "minor", "sm"):
                    return None
                template.append("{%s}" % sub)
            else:
                return None
        if any(isinstance(p, ast.FormattedValue) for p in node.values):
            return "fmt:" + "".join(template)
    return None


_SELF_SET_RE = re.compile(r"^[ \t]+self\.(\w+)\s*(?::[^=\n]*)?=(?!=)", re.M)


def self_subjects(scope):
    """``self.<attr>`` -> capability subject, from every ``self.<attr> = <capability value>`` in the
    file's methods (one value per attr; two different ones make it unreadable)."""
    info = scope.info
    if info.self_cc is not None:
        return info.self_cc
    info.self_cc = {}
    # Cheap first: attributes set where the next few lines name a capability token.
    text = info.source.text
    wanted = set()
    for match in _SELF_SET_RE.finditer(text):
        window = text[match.end():match.end() + 240]
        if has_token(window, ()) or any(name in window for name, v in info.cc_vars.items() if v):
            wanted.add(match.group(1))
    if not wanted:
        return info.self_cc
    table = {}
    for piece in info.pieces:
        locator = Locator(info.source, piece)
        for func in functions_in(piece.tree.body):
            sets = [n for n in statements(func.body) if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Attribute) and isinstance(n.targets[0].value, ast.Name)
                    and n.targets[0].value.id == "self" and n.targets[0].attr in wanted]
            if not sets:
                continue
            local = {}
            inner = Scope(scope.scanner, info, locator, None, local)
            inner.fn = FunctionContext("", None, {}, local, params_of(func))
            collect_local_cc(func, inner, local)
            for stmt in sets:
                subject = cc_subject(stmt.value, inner)
                attr = stmt.targets[0].attr
                if subject is not None:
                    remember_subject(table, attr, subject)
                elif literal(stmt.value) is _NO_VALUE:
                    table[attr] = None  # also set to something else
    info.self_cc = {k: v for k, v in table.items() if v}
    return info.self_cc


def functions_in(body):
    """Every function under these statements, nested ones and methods included."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        for name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, name, None)
            if block:
                stack.extend(block)


def collect_local_cc(func, scope, table):
    """Local names bound to capability values (in statement order, so chains resolve)."""
    assigns = sorted((n for n in statements(func.body) if isinstance(n, (ast.Assign, ast.AnnAssign))),
                     key=lambda n: (n.lineno, n.col_offset))
    for _ in range(2):
        for node in assigns:
            if node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, (ast.Name, ast.Tuple, ast.List)) for t in targets):
                    collect_cc_assignment(table, targets, node.value, scope)
    for name in [k for k, v in table.items() if v is None]:
        del table[name]
    return table


def params_of(func):
    args = func.args
    names = [a.arg for a in getattr(args, "posonlyargs", [])] + [a.arg for a in args.args]
    names += [a.arg for a in args.kwonlyargs]
    for extra in (args.vararg, args.kwarg):
        if extra is not None:
            names.append(extra.arg)
    return names


def cuda_subject(node):
    text = dotted(node) or ""
    if text.endswith("version.cuda"):
        return True
    if isinstance(node, ast.Call):
        if last_name(node.func) in CUDA_VERSION_FUNCS:
            return True
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr == "cuda" and (dotted(sub) or "").endswith("version.cuda"):
                return True
    return False


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
                val = _NO_VALUE  # `x in <capability>`: not a comparison gpuops reads
            atom = {"kind": "cc", "subject": subject, "cmp": flip(opname) if flipped else opname,
                    "value": None if val is _NO_VALUE else val}
            atoms.append({"op": "cap", "atom": atom})
            continue
        if cuda_subject(left) or cuda_subject(right):
            flipped = not cuda_subject(left)
            val = literal(left if flipped else right)
            atom = {"kind": "cuda", "cmp": flip(opname) if flipped else opname,
                    "value": None if val is _NO_VALUE else version_tuple(val)}
            atoms.append({"op": "cap", "atom": atom})
            continue
        return None
    if len(atoms) == 1:
        return atoms[0]
    return {"op": "and", "args": atoms}


_FROM_IMPORT_RE = re.compile(r"^from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)


def import_in_text(info, name):
    """(module, name) of a module-level ``from m import name`` the parsed pieces do not hold (an
    import line names no token), or None."""
    if name not in info.source.text:
        return None
    for match in _FROM_IMPORT_RE.finditer(info.source.text):
        for part in match.group(2).strip("()").replace("\n", " ").split(","):
            words = part.split("#")[0].split()
            if words and (words[-1] == name) and (len(words) == 1 or words[-2] == "as"):
                module = match.group(1)
                level = len(module) - len(module.lstrip("."))
                return resolve_relative(info, module.lstrip(".") or None, level), words[0]
    return None


def table_lookup(node, scope):
    """``TABLE[<capability>]`` among a comparison's operands, TABLE a literal dict: the atom
    "capability in TABLE's keys", or None."""
    for operand in [node.left] + list(node.comparators):
        if not isinstance(operand, ast.Subscript):
            continue
        index = operand.slice.value if isinstance(operand.slice, _INDEX) else operand.slice
        subject = cc_subject(index, scope)
        if subject is None:
            continue
        keys = member_values(operand.value, scope)
        if isinstance(keys, list) and keys:
            return {"op": "cap", "atom": {"kind": "cc", "subject": subject, "cmp": "in", "value": keys}}
    return None


def member_values(node, scope):
    """The literal a capability is compared with: a constant, a module constant named, or the keys
    of a dict (``cap in {(9, 0): ..., (10, 0): ...}``)."""
    value = literal_collection(node)
    if (value is _NO_VALUE and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls") and scope.fn is not None and "." in (scope.fn.qual or "")):
        # `cls.supported_capabilities`: a literal assigned in the class body.
        value = class_constant(scope.info, scope.fn.qual.split(".")[-2], node.attr)
    if value is _NO_VALUE and isinstance(node, ast.Name) and scope.scanner is not None and not scope.shadowed(node.id):
        value = scope.scanner.constant(scope.info, node.id)  # e.g. SUPPORTED_ARCHS = [(9, 0), ...]
    return value


_CAP_NAME_RE = re.compile(r"cap|(^|_)sm($|_)|arch|major|minor|(^|_)cc($|_)|compute", re.I)


def param_shaped(node, scope):
    """Is this how a capability parameter is read (``p[0]``, ``p.major``, ``(p.major, p.minor)``, or
    a parameter whose name says so)? Only then are its call sites looked up (they cost a search)."""
    if isinstance(node, ast.Tuple):
        return len(node.elts) == 2 and all(param_shaped(e, scope) for e in node.elts)
    if isinstance(node, ast.Subscript):
        index = node.slice.value if isinstance(node.slice, _INDEX) else node.slice
        return literal(index) in (0, 1) and isinstance(node.value, ast.Name) and node.value.id in scope.fn.params
    if isinstance(node, ast.Attribute):
        return node.attr in ("major", "minor") and isinstance(node.value, ast.Name) and node.value.id in scope.fn.params
    return isinstance(node, ast.Name) and node.id in scope.fn.params and _CAP_NAME_RE.search(node.id) is not None


def class_constant(info, cls, name):
    """The literal ``name = ...`` in the body of class ``cls`` of this file, or _NO_VALUE."""
    for piece in info.pieces:
        bodies = []
        if piece.in_class and piece.qual == cls:
            bodies.append(piece.tree.body)
        elif not piece.in_class:
            bodies.extend(s.body for s in piece.tree.body if isinstance(s, ast.ClassDef) and s.name == cls)
        for body in bodies:
            for stmt in body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                if stmt_value(stmt) is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    value = literal_collection(stmt.value)
                    if value is not _NO_VALUE:
                        return value
    return _NO_VALUE


def stmt_value(stmt):
    return getattr(stmt, "value", None)


def capability_like(value):
    """Does this literal look like what a capability is compared with (9, 120, (9, 0), "sm90")?"""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 7 <= value <= 13 or 70 <= value <= 130
    if isinstance(value, str):
        return re.match(r"^sm_?\d{2,3}[a-z]?$", value) is not None
    if isinstance(value, list):
        if len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return 7 <= value[0] <= 13 and 0 <= value[1] <= 9
        return bool(value) and all(capability_like(v) for v in value)
    return False


def literal_collection(node):
    if isinstance(node, ast.Dict):
        keys = [literal(k) for k in node.keys if k is not None]
        return _NO_VALUE if len(keys) != len(node.keys) or _NO_VALUE in keys else keys
    return literal(node)


def walk_no_nested(body):
    """Every node under ``body`` except inside nested functions and classes."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def flip(op):
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)


def has_atoms(tree, kinds):
    op = tree.get("op")
    if op in kinds:
        if op == "cap" and "gen" in kinds:
            return tree["atom"]["kind"] in ("pred", "cc")
        return True
    if op in ("and", "or"):
        return any(has_atoms(a, kinds) for a in tree["args"])
    if op == "not":
        return has_atoms(tree["arg"], kinds)
    if op == "alias":
        return has_atoms(tree["expr"], kinds)
    return False


def is_gate_tree(tree):
    """A gate tests the GPU generation: a predicate or a capability comparison (not just CUDA-ness)."""
    op = tree.get("op")
    if op == "cap":
        return tree["atom"]["kind"] in ("pred", "cc")
    if op in ("and", "or"):
        return any(is_gate_tree(a) for a in tree["args"])
    if op == "not":
        return is_gate_tree(tree["arg"])
    if op == "alias":
        return is_gate_tree(tree["expr"])
    return False


def boolish(node):
    return isinstance(node, (ast.BoolOp, ast.Compare, ast.Name, ast.Attribute, ast.Call)) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))


def interesting(node, scope):
    """Cheap pre-check: does this expression mention anything a gate is made of?"""
    info = scope.info
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            name = sub.id
            if (name in scope.local_aliases or name in info.aliases or name in scope.cc_vars
                    or name in CC_FUNCS or name in SM_FUNCS or name in PROPS_FUNCS
                    or PRED_NAME_RE.match(name) or scope.scanner.is_predicate(name)
                    or info.cc_vars.get(name) or info.cc_funcs.get(name) or name in scope.scanner.flow_imports(info)):
                return True
            if scope.fn is not None and name in scope.fn.params and _CAP_NAME_RE.search(name):
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
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.keyword):
            child = child.value
        if isinstance(child, ast.expr):
            found.extend(bool_roots(child, scope))
        elif isinstance(child, ast.comprehension):
            for part in [child.iter] + list(child.ifs):
                found.extend(bool_roots(part, scope))
    return found


# ---------------------------------------------------------------- walking statements for gates

EXIT_VALUES = (None, False, 0, "", (), [], {})


_NOTE_CALL_RE = re.compile(r"(log|warn|print|debug|info|error)", re.I)


def is_guard_body(body):
    """Does this if-body only refuse (raise, or return nothing/False after at most some logging)?
    A body that does the work and then returns is a branch, not a guard."""
    if not body or not is_denying_exit(body[-1]):
        return False
    if isinstance(body[-1], ast.Raise):
        return True
    for stmt in body[:-1]:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _NOTE_CALL_RE.search(dotted(stmt.value.func) or ""):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        return False
    return True


def is_denying_exit(stmt):
    if isinstance(stmt, (ast.Raise, ast.Continue)):
        return True
    if isinstance(stmt, ast.Return):
        if stmt.value is None:
            return True
        value = literal(stmt.value)
        return value is not _NO_VALUE and (value is None or value is False or value in ([], {}, "", 0))
    return False


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
            effect["returns"] = locator.text(last.value, 120) if value is _NO_VALUE else value
    return effect


class FunctionContext(object):
    def __init__(self, qual, doc, local_aliases, cc_vars, params=(), assigned=(), first_is_self=False):
        self.qual = qual
        self.doc = doc
        self.local_aliases = local_aliases
        self.cc_vars = cc_vars
        self.params = list(params)
        self.first_is_self = first_is_self
        # Names that mean something local here, never the module's predicate of that name.
        self.shadow = set(params) | set(assigned)
        names = list(local_aliases) + [n for n, v in cc_vars.items() if v]
        self.words = [w for w in names if not any(t in w for t in TOKENS)]

    def mentions(self, source, first, last):
        text = "".join(source.lines[first - 1:last])
        return any(w in text for w in self.words)


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


def statements(body):
    """Every statement under ``body`` (not expressions), without entering nested functions."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, name, None)
            if block:
                stack.extend(block)


def docstring_line(func):
    doc = ast.get_docstring(func, clean=True) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
    return doc.strip().splitlines()[0][:200] if doc and doc.strip() else None


class GateWalker(object):
    def __init__(self, scanner, info, locator):
        self.scanner = scanner
        self.info = info
        self.locator = locator
        self.found = []

    def walk_body(self, body, fn, within):
        line0 = self.locator.line0
        source = self.info.source
        for stmt in body:
            first = stmt.lineno + line0
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.decorator_list:
                first = min(first, stmt.decorator_list[0].lineno + line0)
            last = (getattr(stmt, "end_lineno", None) or stmt.lineno) + line0
            if not source.mentions_words(first, last) and not (fn.words and fn.mentions(source, first, last)):
                continue  # nothing a gate is made of is written in this statement
            self.walk_stmt(stmt, fn, within)

    def scope(self, fn):
        return Scope(self.scanner, self.info, self.locator, fn.local_aliases, fn.cc_vars, fn)

    def emit(self, stmt, node, tree, fn, within, kind, polarity, effect, scope):
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

    def walk_stmt(self, stmt, fn, within):
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
            self.walk_body(stmt.body, inner, [])
            return
        if isinstance(stmt, ast.ClassDef):
            qual = (fn.qual + "." if fn.qual else "") + stmt.name
            self.walk_body(stmt.body, FunctionContext(qual, docstring_line(stmt), {}, {}), [])
            return
        if isinstance(stmt, (ast.If, ast.While)):
            found, scope = self.roots(stmt.test, fn)
            test_is_root = any(n is stmt.test for n, _ in found)
            for node, tree in found:
                if node is stmt.test:
                    deny = isinstance(stmt, ast.If) and is_guard_body(stmt.body)
                    kind = "guard" if deny else ("if" if isinstance(stmt, ast.If) else "while")
                    self.emit(stmt, node, tree, fn, within, kind, -1 if deny else 1,
                              body_effect(stmt.body, self.locator), scope)
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
                self.emit(stmt, node, tree, fn, within, "assign" if node is stmt.value else "expr", 1, effect, scope)
            self.emit_nested(stmt, fn, within, scope)
            return
        # Everything else: look inside its expressions, then its nested statements.
        for field, value in ast.iter_fields(stmt):
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


def only_atoms(tree):
    op = tree.get("op")
    if op in ("cap", "platform"):
        return True
    if op in ("and", "or"):
        return all(only_atoms(a) for a in tree["args"])
    if op == "not":
        return only_atoms(tree["arg"])
    if op == "alias":
        return only_atoms(tree["expr"])
    return False


# ---------------------------------------------------------------- the whole scan

class Scanner(object):
    def __init__(self, root):
        self.root = root
        self.files = {}
        self.defs = {}          # predicate name -> [rel, ...]
        self.method_defs = {}   # predicate name -> {rel, ...} where it is a class method
        self.cc_tables = {}     # rel -> {"vars": {name: subject}, "funcs": {name: subject}}
        self._param_cache = {}
        self._trees = {}
        self._module_aliases = {}
        self._light = {}
        self.platform_map = {}
        self.errors = []
        self.texts = {}
        self.predicates = []
        self.parsed_count = None
        self.files_total = 0
        self._constant_cache = {}
        self._site_infos = {}   # rel -> FileInfo as loaded (see site_info)
        self._walked = set()

    def is_predicate(self, name):
        return name in self.defs

    def resolve_predicate(self, info, name, form="call"):
        """The file whose definition ``name`` means at this place: the module's own function, what
        its import names, else (a method of an object: ``current_platform.is_blackwell()``,
        ``cls.is_sm120()``) the class methods of this file, then of this subpackage."""
        own = info.predicates.get(name)
        method = form in ("method", "attr")
        if own is not None and bool(own.get("cls")) == method:
            return info.rel
        if name in info.imports and not method:
            module, original = info.imports[name]
            for rel in module_files(module):
                if rel in self.defs.get(original, ()):
                    return rel
            name = original
        candidates = self.defs.get(name, [])
        if not candidates:
            return None
        methods = [rel for rel in candidates if rel in self.method_defs.get(name, ())]
        functions = [rel for rel in candidates if rel not in methods]
        ranked = (methods + functions) if method else (functions + methods)
        for test in (lambda rel: rel == info.rel, lambda rel: rel.split("/", 1)[0] == info.top,
                     lambda rel: rel.startswith("srt/utils"), lambda rel: True):
            for rel in ranked:
                if test(rel):
                    return rel
        return None

    def constant(self, info, name, depth=0):
        """A module-level literal collection (a list of model architectures, a tuple of capabilities,
        a dict's keys) named in a clause or comparison, in this module or imported from another."""
        key = (info.rel, name)
        if key in self._constant_cache:
            return self._constant_cache[key]
        value = _NO_VALUE
        imported = info.imports.get(name) or import_in_text(info, name)
        if name in info.aliases:
            value = literal_collection(info.aliases[name][0])
        elif imported and depth < 3:
            module, original = imported
            for rel in module_files(module):
                other = self.site_info(rel) if rel in self.texts else None
                if other is not None:
                    value = self.constant(other, original, depth + 1)
                    break
        else:
            pattern = re.compile(r"^%s\s*(?::[^=]*)?=" % re.escape(name))
            lines = info.source.lines
            starts = [s for s in segment_starts(lines, "") if s >= 0]
            for begin, end in zip(starts, starts[1:] + [len(lines)]):
                if pattern.match(lines[begin]):
                    try:
                        tree = ast.parse("".join(lines[begin:end]))
                        stmt = tree.body[0]
                        value = literal_collection(stmt.value) if getattr(stmt, "value", None) is not None else _NO_VALUE
                    except (SyntaxError, ValueError, IndexError):
                        value = _NO_VALUE
                    break
        if value is not _NO_VALUE and not isinstance(value, list):
            value = _NO_VALUE
        self._constant_cache[key] = value
        return value

    def param_subject(self, info, fn, param):
        """The capability subject every call site in the tree passes for ``param`` of ``fn`` (a
        function or method of this file), or None (a call site passes something else, passes
        nothing, or the function is used in a way not seen as a call)."""
        name = fn.qual.split(".")[-1] if fn.qual else None
        key = (info.rel, fn.qual, param)
        if key in self._param_cache:
            return self._param_cache[key]
        self._param_cache[key] = None  # recursion guard
        subject = None
        if name and len(name) > 3 and param in fn.params and not name.startswith("__"):
            subject = self._call_sites_agree(name, fn, param)
        self._param_cache[key] = subject
        return subject

    def module_alias(self, module, name, depth=0):
        """(value node, locator, FileInfo) of ``name`` assigned at module level in ``module`` (or
        imported there, star imports followed), or None."""
        key = (module, name)
        if key in self._module_aliases:
            return self._module_aliases[key]
        self._module_aliases[key] = None
        found = None
        for rel in module_files(module):
            other = self.light_info(rel, name)
            if other is None:
                continue
            if name in other.aliases:
                value, locator = other.aliases[name]
                found = (value, locator, other)
            elif name in other.imports and depth < 4:
                found = self.module_alias(other.imports[name][0], other.imports[name][1], depth + 1)
            elif depth < 4:
                for star in other.star_imports:
                    found = self.module_alias(star, name, depth + 1)
                    if found is not None:
                        break
            break
        self._module_aliases[key] = found
        return found

    def light_info(self, rel, name):
        """A module's definitions (the pieces naming ``name`` or a token), parsed on their own."""
        if rel not in self.texts:
            return None
        key = (rel, name)
        if key not in self._light:
            try:
                info = FileInfo(FileSource(rel, self.texts[rel].decode("utf-8")))
                info.pieces = split_pieces(info.source, [name, "import"])
                collect_definitions(info)
            except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeDecodeError):
                info = None
            self._light[key] = info
        return self._light[key]

    def param_predicate(self, info, fn, param):
        """The GPU test every call site in the tree passes for the bool parameter ``param``, as a
        condition tree (spans at the first call site), or None."""
        name = fn.qual.split(".")[-1] if fn.qual else None
        key = (info.rel, fn.qual, param, "predicate")
        if key not in self._param_cache:
            self._param_cache[key] = None
            if name and len(name) > 3 and param in fn.params and not name.startswith("__"):
                self._param_cache[key] = self._call_sites_agree(name, fn, param, predicate=True)
        return self._param_cache[key]

    def _call_sites_agree(self, name, fn, param, predicate=False):
        first = None
        needle = name.encode()
        holders = [rel for rel in sorted(self.texts) if needle in self.texts[rel]]
        if len(holders) > 6:
            return None  # a common name: its call sites are not worth proving
        position = fn.params.index(param)
        subjects = set()
        for rel in holders:
            try:
                info = self.site_info(rel)
                if info is None:
                    raise ValueError("not UTF-8")
                pieces = self.statements_naming(info, name)
            except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeDecodeError):
                return None
            references = calls = 0
            for piece in pieces:
                tree = piece.tree
                # Every reference to the name must be a call (not a callback, a registry entry, ...).
                references += sum(1 for n in ast.walk(tree) if (isinstance(n, ast.Name) and n.id == name)
                                  or (isinstance(n, ast.Attribute) and n.attr == name))
                sites = self._sites_in_piece(info, piece, name, fn, param, position, predicate)
                if sites is None:
                    return None
                calls += len(sites)
                for subject, argtree in sites:
                    subjects.add(subject)
                    first = first or argtree
                if len(subjects) > 1 or None in subjects:
                    return None
            if calls != references:
                return None
        if predicate:
            return first if len(subjects) == 1 else None
        return subjects.pop() if len(subjects) == 1 else None

    def _sites_in_piece(self, info, piece, name, fn, param, position, predicate):
        """[(subject or GPU-test text, tree or None)] for each call of ``name`` in the piece; None
        when one passes nothing for ``param``."""
        tree = piece.tree
        out = []
        for func in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            own = [n for n in walk_no_nested(func.body) if isinstance(n, ast.Call) and last_name(n.func) == name]
            if not own:
                continue
            local = {}
            scope = Scope(self, info, None, None, local)
            if func is not tree:
                params = params_of(func)
                # The caller's own parameter may carry it on (proven the same way, cached).
                scope.fn = FunctionContext(func.name, None, {}, local, params, (),
                                           first_is_self=bool(params) and params[0] in ("self", "cls"))
                collect_local_cc(func, scope, local)
                scope.param_flow = True
            for call in own:
                shift = 1 if fn.first_is_self and isinstance(call.func, ast.Attribute) else 0
                arg = None
                for kw in call.keywords:
                    if kw.arg == param:
                        arg = kw.value
                if arg is None and 0 <= position - shift < len(call.args):
                    if any(isinstance(a, ast.Starred) for a in call.args[:position - shift + 1]):
                        return None
                    arg = call.args[position - shift]
                if arg is None:
                    return None  # the default is used: not a capability
                if predicate:
                    # The same pure GPU test at every call site (`is_blackwell=current_platform.is_blackwell()`).
                    scope.locator = Locator(info.source, piece)
                    argtree = build(arg, scope) if interesting(arg, scope) else None
                    if argtree is None or not only_atoms(argtree) or not is_gate_tree(argtree):
                        return None
                    out.append((" ".join(scope.locator.text(arg).split()), argtree))
                else:
                    out.append((cc_subject(arg, scope), None))
        return out

    def statements_naming(self, info, name):
        """The pieces (top-level statements, or members of a long class) of ``info`` whose text holds
        ``name`` (cached): all its references live there. Raises SyntaxError when one does not
        parse on its own."""
        key = (info.rel, name)
        if key not in self._trees:
            lines = info.source.lines
            pieces = []
            starts = segment_starts(lines, "", info.source.text)
            for begin, end in merge_string_runs(info.source, starts, len(lines)):
                chunk = "".join(lines[begin:end])
                if name not in chunk:
                    continue
                members = None
                if end - begin > 150 and re.search(r"^class\s", chunk, re.M):
                    members = split_class(info.source, begin, end, [name], set())
                if members is None:
                    pieces.append(Piece(begin, 0, ast.parse(chunk), "", False))
                else:
                    pieces.extend(members)  # the members naming it (or a token); others cannot call it
            self._trees[key] = pieces
        return self._trees[key]

    def run(self, jobs=1):
        """All gates of the package, sorted, with ids; the predicate table is in ``self.predicates``."""
        self.read_files()
        gates = None
        if jobs > 1 and len(self.texts) >= 16 * jobs and hasattr(os, "fork"):
            gates = self.run_forked(sorted(self.texts), jobs)  # each worker selects from its share
        if gates is None:
            self.load(self.select(self.texts), ())
            self.set_tables(self.local_tables())
            self.reload_extra()
            gates = self.walk_all()
            self.predicates = self.predicate_table()
        gates.sort(key=lambda g: (g["file"], g["line"], g["condition"]["span"][1]))
        counters = {}
        for gate in gates:
            key = (gate["file"], gate["function"])
            counters[key] = counters.get(key, 0) + 1
            gate["id"] = "%s::%s#%d" % (gate["file"], gate["function"], counters[key])
        self.errors.sort(key=lambda e: e["file"])
        return gates

    def select(self, rels):
        """The files that hold a token (a plain substring search: fast)."""
        tokens = [t.encode() for t in TOKENS]
        return [rel for rel in rels if any(t in self.texts[rel] for t in tokens)]

    def read_files(self):
        for rel, path in walk_python_files(self.root):
            self.files_total += 1
            try:
                with open(path, "rb") as handle:
                    self.texts[rel] = handle.read()
            except OSError as exc:
                self.errors.append({"file": rel, "error": "cannot read: %s" % exc.strerror})

    def load(self, rels, extra_names):
        """Parse ``rels`` (again, with more names, when already parsed) and collect their definitions."""
        for rel in rels:
            info = self.files.get(rel)
            if info is None:
                try:
                    text = self.texts[rel].decode("utf-8")
                except UnicodeDecodeError:
                    self.errors.append({"file": rel, "error": "not UTF-8"})
                    continue
                info = FileInfo(FileSource(rel, text))
            load_info(info, extra_names)
            if info.error:
                self.errors.append({"file": rel, "error": info.error})
                self.files.pop(rel, None)
                continue
            self.files[rel] = info

    def extra_names(self):
        return sorted(n for n in self.defs if not any(t in n for t in TOKENS))

    def site_info(self, rel):
        """``rel`` as another file's analysis (call sites, constants) may see it: as loaded, before
        its own walk, whichever worker holds it and whether or not it was walked already, so that
        the result depends neither on how files are shared among workers nor on walk order.
        Files the scan does not load are read bare, as before. None when not UTF-8."""
        info = self.files.get(rel)
        if info is not None and rel not in self._walked:
            return info
        if rel not in self._site_infos:
            found = None
            try:
                found = FileInfo(FileSource(rel, self.texts[rel].decode("utf-8")))
            except UnicodeDecodeError:
                found = None
            if found is not None and self.select([rel]):
                loaded = FileInfo(FileSource(rel, found.source.text))
                load_info(loaded, ())
                extra = [n for n in self.extra_names() if n.encode() in self.texts[rel]]
                if extra and not loaded.error:
                    load_info(loaded, extra)
                if not loaded.error:
                    found = loaded  # an unparseable file is not loaded by the scan: read it bare
            self._site_infos[rel] = found
        return self._site_infos[rel]

    def local_tables(self):
        """What other files need to know about these: predicate names (and which are class
        methods), platform tables, capability values and functions, per file."""
        return {rel: (sorted(info.predicates), info.platform_map,
                      sorted(n for n, m in info.predicates.items() if m.get("cls")),
                      ({k: v for k, v in info.cc_vars.items() if v}, {k: v for k, v in info.cc_funcs.items() if v}))
                for rel, info in self.files.items()}

    def set_tables(self, per_file):
        self.defs = {}
        self.method_defs = {}
        self.platform_map = {}
        self.cc_tables = {}
        for rel in sorted(per_file):
            names, platform_map, methods, (cc_vars, cc_funcs) = per_file[rel]
            for name in names:
                self.defs.setdefault(name, []).append(rel)
            for name in methods:
                self.method_defs.setdefault(name, set()).add(rel)
            self.platform_map.update(platform_map)
            if cc_vars or cc_funcs:
                self.cc_tables[rel] = {"vars": cc_vars, "funcs": cc_funcs}

    def reload_extra(self):
        """Predicates with names no token covers (rare): parse again where such a name is used,
        only in files already read (a token-less predicate is used where it lives)."""
        extra = self.extra_names()
        if extra:
            names = [n.encode() for n in extra]
            again = [rel for rel in sorted(self.files) if any(n in self.texts[rel] for n in names)]
            self.load(again, extra)

    def walk_all(self):
        gates = []
        extra_words = [n for n in self.defs if not any(t in n for t in TOKENS)]
        for rel in sorted(self.files):
            info = self.files[rel]
            self._walked.add(rel)  # from here on its pieces grow: others read it through site_info
            found = []
            try:
                words = self.flow_names(info)
                if words and not info.whole:
                    before = len(info.pieces)
                    parse_file(info, words)  # the pieces that use them without naming a token
                    if len(info.pieces) != before:
                        info.self_cc = None
                        words = self.flow_names(info)
                info.source.mark_words(list(TOKENS) + extra_words + words)
                for piece in info.pieces:
                    locator = Locator(info.source, piece)
                    walker = GateWalker(self, info, locator)
                    ctx = FunctionContext(piece.qual, None, {}, {})
                    walker.walk_body(piece.tree.body, ctx, [])
                    found.extend(walker.found)
            except (RecursionError, MemoryError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
                # One odd file must not cost the whole report: it is listed as not understood.
                self.errors.append({"file": rel, "error": "scanner could not read it (%s)" % type(exc).__name__})
                continue
            gates.extend(found)
        return gates

    def flow_imports(self, info):
        """Names this file imports that are capability values or functions in their module."""
        found = getattr(info, "_flow_imports", None)
        if found is None:
            scope = Scope(self, info, None)
            found = set(n for n in info.imports if scope.imported(n, "vars") or scope.imported(n, "funcs"))
            info._flow_imports = found
        return found

    def flow_names(self, info):
        """Names that carry a capability in this file without holding a token: module aliases of
        gates, capability values and functions (its own and imported), ``self`` attributes set to one."""
        names = set(gate_alias_names(info))
        names.update(n for n, v in info.cc_vars.items() if v)
        names.update(info.cc_funcs)
        names.update(self.flow_imports(info))
        names.update(self_subjects(Scope(self, info, None)))
        return sorted(n for n in names if len(n) > 2 and not any(t in n for t in TOKENS))

    def run_forked(self, selected, jobs):
        """The same scan over ``jobs`` forked workers (each parses and walks its share; definitions
        are exchanged in between). None when anything goes wrong: the caller scans serially."""
        buckets = [[] for _ in range(jobs)]
        sizes = [0] * jobs
        for rel in sorted(selected, key=lambda r: -len(self.texts[r])):
            i = sizes.index(min(sizes))
            buckets[i].append(rel)
            sizes[i] += len(self.texts[rel])
        children = []
        try:
            for bucket in buckets:
                up_r, up_w = os.pipe()
                down_r, down_w = os.pipe()
                pid = os.fork()
                if pid == 0:  # the worker
                    os.close(up_r)
                    os.close(down_w)
                    code = 0
                    try:
                        self.worker(bucket, os.fdopen(up_w, "wb"), os.fdopen(down_r, "rb"))
                    except BaseException:
                        code = 1
                    os._exit(code)
                os.close(up_w)
                os.close(down_r)
                children.append((pid, os.fdopen(up_r, "rb"), os.fdopen(down_w, "wb")))
            per_file = {}
            errors = []
            for _, up, _ in children:
                message = receive(up)
                per_file.update(message[0])
                errors.extend(message[1])
            self.set_tables(per_file)
            for _, _, down in children:
                send(down, per_file)
                down.close()
            gates, predicates, parsed = [], [], 0
            for _, up, _ in children:
                message = receive(up)
                gates.extend(message[0])
                predicates.extend(message[1])
                errors.extend(message[2])
                parsed += message[3]
        except (OSError, EOFError, ValueError, pickle.PickleError):
            return None
        finally:
            for pid, up, down in children:
                for handle in (up, down):
                    try:
                        handle.close()
                    except OSError:
                        pass
                try:
                    os.waitpid(pid, 0)
                except OSError:
                    pass
        self.errors.extend(errors)
        self.predicates = sorted(predicates, key=lambda p: (p["file"], p["name"]))
        self.parsed_count = parsed
        return gates

    def worker(self, bucket, up, down):
        self.errors = []
        self.load(self.select(bucket), ())
        send(up, (self.local_tables(), self.errors))
        self.errors = []
        self.set_tables(receive(down))
        self.reload_extra()
        gates = self.walk_all()
        send(up, (gates, self.predicate_table(), self.errors, len(self.files)))
        up.close()

    def predicate_table(self):
        out = []
        for rel in sorted(self.files):
            info = self.files[rel]
            for name, meaning in sorted(info.predicates.items()):
                entry = {"name": name, "file": rel, "line": meaning.get("line"), "source": meaning.get("source")}
                if "majors" in meaning:
                    entry["majors"] = meaning["majors"]
                    entry["min_cuda"] = meaning.get("min_cuda")
                elif "same_as" in meaning:
                    entry["same_as"] = meaning["same_as"]
                elif "def_node" in meaning:
                    entry["expr"] = self.definition_tree(info, *meaning["def_node"])
                if meaning.get("cls"):
                    entry["cls"] = meaning["cls"]
                out.append(entry)
        return out


    def definition_tree(self, info, func, body, locator):
        """The condition a short predicate returns, with its early returns folded in:
        ``if not cls.is_cuda_static(): return False`` then ``return cap[0] == 10`` is
        ``is_cuda and cap[0] == 10``."""
        func._gpuops_line0 = locator.line0
        local_aliases, cc_vars, params, assigned = function_locals(func, self, info, locator)
        fn = FunctionContext(func.name, None, local_aliases, cc_vars, params, assigned)
        scope = Scope(self, info, locator, local_aliases, cc_vars, fn)
        tree = build(body[-1].value, scope)
        for stmt in reversed(body[:-1]):
            if not isinstance(stmt, ast.If):
                continue
            test = build(stmt.test, scope)
            if literal_return(stmt.body[0]):
                tree = {"op": "or", "args": [test, tree], "span": test["span"], "text": test.get("text")}
            else:
                tree = {"op": "and", "args": [{"op": "not", "arg": test, "span": test["span"], "text": test.get("text")},
                                              tree], "span": test["span"], "text": test.get("text")}
        return tree


def gate_alias_names(info):
    """Module aliases whose value (or the value of an alias it names) mentions a capability token."""
    relevant = set()
    changed = True
    texts = {}
    for name, (value, locator) in info.aliases.items():
        texts[name] = locator.text(value, 100000)
    while changed:
        changed = False
        for name, text in texts.items():
            if name in relevant or any(t in name for t in TOKENS):
                continue
            if has_token(text, ()) or any(re.search(r"\b%s\b" % re.escape(r), text) for r in relevant):
                relevant.add(name)
                changed = True
    return sorted(relevant)


def send(handle, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    handle.write(struct.pack("<Q", len(data)))
    handle.write(data)
    handle.flush()


def receive(handle):
    head = handle.read(8)
    if len(head) != 8:
        raise EOFError("a scan worker stopped")
    size = struct.unpack("<Q", head)[0]
    data = handle.read(size)
    if len(data) != size:
        raise EOFError("a scan worker stopped")
    return pickle.loads(data)


def default_jobs():
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def module_files(module):
    parts = module.split(".")
    if not parts or parts[0] != "sglang":
        return []
    rel = "/".join(parts[1:])
    if not rel:
        return ["__init__.py"]
    return [rel + ".py", rel + "/__init__.py"]


def gate_context(gate):
    effect = gate.get("effect") or {}
    parts = [gate["function"], gate.get("doc") or "", gate["text"], " ".join(gate.get("within") or []),
             effect.get("message") or "", json.dumps(effect.get("returns")), " ".join(effect.get("sets") or []),
             " ".join(gate.get("reads") or [])]
    return "\n".join(parts)


def scan(opts):
    started = time.time()
    cpu_started = time.process_time()
    result = {"scanner": SCANNER_VERSION, "python": "%d.%d.%d" % sys.version_info[:3], "ok": False}
    root, reason = find_sglang(opts)
    if root is None:
        result["reason"] = reason
        result["elapsed_s"] = round(time.time() - started, 3)
        return result
    result["root"] = root
    result["version"] = find_version(root)
    from gpuops.remote import scan_fingerprint  # the stat walk that lets a client keep its scan

    fingerprint = scan_fingerprint.tree_fingerprint(root, opts, result["version"])  # before reading: an edit during the scan changes the next one
    if fingerprint is not None and fingerprint in scan_fingerprint.known_fingerprints(opts):
        return scan_fingerprint.unchanged_answer(result, fingerprint)
    result["fingerprint"] = fingerprint
    scanner = Scanner(root)
    jobs = opts.get("jobs")
    jobs = default_jobs() if not isinstance(jobs, int) or jobs < 1 else jobs
    children_before = os.times()
    gates = scanner.run(jobs)
    result["ok"] = True
    result["jobs"] = jobs
    result["files_total"] = scanner.files_total
    result["files_parsed"] = scanner.parsed_count if scanner.parsed_count is not None else len(scanner.files)
    result["errors"] = scanner.errors
    result["predicates"] = scanner.predicates
    result["platform_attrs"] = scanner.platform_map
    result["gates"] = gates
    patterns = []
    for pattern in opts.get("keywords") or []:
        try:
            patterns.append(re.compile(pattern, re.I))
        except re.error:
            pass
    for error in scanner.errors:
        text = scanner.texts.get(error["file"], b"").decode("utf-8", "replace")
        error["matches"] = [p.pattern for p in patterns if p.search(text)]
    if opts.get("with_sources"):
        wanted = sorted({g["file"] for g in gates if not patterns or any(p.search(gate_context(g)) for p in patterns)})
        result["sources"] = {rel: scanner.texts[rel].decode("utf-8") for rel in wanted}
    children = os.times()
    result["elapsed_s"] = round(time.time() - started, 3)
    result["cpu_s"] = round(time.process_time() - cpu_started + (children.children_user - children_before.children_user)
                            + (children.children_system - children_before.children_system), 3)
    return result


def main(argv):
    opts, problem = read_options(argv)
    if opts is None:
        out = {"scanner": SCANNER_VERSION, "ok": False, "reason": problem}
    else:
        try:
            out = scan(opts)
        except Exception as exc:  # report, never a traceback on the host's side
            out = {"scanner": SCANNER_VERSION, "ok": False, "reason": "scanner failed: %s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(out, sort_keys=True))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
