"""Gate scan, stage 2: cut a file into pieces (top-level statements, or a long class's members) by a
cheap column scan, and parse only those that mention a token. ``FileSource`` is a file's text with
its line offsets and which lines name a word. Host code: stdlib only, Python 3.8+."""

import ast
import bisect
import itertools
import re

from gpuops.remote.scan_vocabulary import has_token


_ASSIGN_NAME_RE = re.compile(r"^([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")

_PLATFORM_TEXT_RE = re.compile(r"\bis_(cuda|cuda_alike|hip|npu|xpu|cpu|musa|mps|hpu)\b")

_COL0_RE = re.compile(r"^[^\s#)\]}]", re.M)

_CONTINUATION_RE = re.compile(r"^(else|elif|except|finally)\b")


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
    def __init__(self, rel, text, memo=None):
        self.rel = rel
        self.text = text
        # The scan's memo of what comes of a file's text alone (its pieces' trees, its statements'
        # line ranges), shared by every reading of its files: parse_chunk, module_ranges, class_ranges.
        self.memo = memo
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


def parse_chunk(source, line0, indent, chunk):
    """``ast.parse(chunk)``, the piece ``chunk`` of ``source`` that begins ``line0`` lines down,
    ``indent`` columns in. A file is read more than once in a scan (loaded, then again as another
    file's lookups see it: call sites, constants, aliases), and the same pieces were parsed each
    time (a third of the parsing); with ``source.memo`` (a dict the scanner shares) a piece is
    parsed once and its tree shared by the readings of that same place. A piece that does not
    parse raises each time, as before."""
    memo = source.memo
    if memo is None:
        return ast.parse(chunk)
    key = (source.rel, line0, indent, chunk)
    tree = memo.get(key)
    if tree is None:
        tree = memo[key] = ast.parse(chunk)
    return tree


def module_ranges(source):
    """The (begin, end) line ranges of the file's top-level statements (``segment_starts`` merged
    by ``merge_string_runs``), kept in ``source.memo``: each reading of a file (loaded, as call
    sites and constants see it, for each name looked up in it) needs them. Shared: read only."""
    key = ("module ranges", source.rel)
    ranges = source.memo.get(key) if source.memo is not None else None
    if ranges is None:
        ranges = merge_string_runs(source, segment_starts(source.lines, "", source.text), len(source.lines))
        if source.memo is not None:
            source.memo[key] = ranges
    return ranges


def class_ranges(source, body_start, end, indent):
    """The same for the members of a class whose body is lines ``body_start`` to ``end`` at
    ``indent``, relative to ``body_start``."""
    key = ("class ranges", source.rel, body_start, end, indent)
    ranges = source.memo.get(key) if source.memo is not None else None
    if ranges is None:
        body = source.lines[body_start:end]
        ranges = merge_string_runs(source, segment_starts(body, indent), len(body), body_start)
        if source.memo is not None:
            source.memo[key] = ranges
    return ranges


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


def split_pieces(source, extra_names, skip=()):
    """Parse only the top-level statements (or long classes' members) that may matter.

    Raises SyntaxError when a piece does not parse on its own (the caller parses the whole file).
    ``skip``: first lines of pieces already parsed (a second pass adds only new ones).
    """
    lines = source.lines
    pieces = []
    for begin, end in module_ranges(source):
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
        pieces.append(Piece(begin, 0, parse_chunk(source, begin, 0, chunk), "", False))
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
    for rb, re_ in class_ranges(source, body_start, end, indent):
        chunk_lines = body[rb:re_]
        absolute = body_start + rb
        if absolute in skip or not has_token("".join(chunk_lines), extra_names):
            continue
        # Lines indented less than the member (inside a string or brackets) lose what they have:
        # only the structure matters here, and spans are read from the file's own lines.
        dedented = [line[width:] if line.startswith(indent) else line.lstrip(" \t") for line in chunk_lines]
        pieces.append(Piece(absolute, width, parse_chunk(source, absolute, width, "".join(dedented)), class_name, True))
    return pieces
