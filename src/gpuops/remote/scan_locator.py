"""Gate scan: turn a piece's node positions into file positions and quote the source they span.
Host code: stdlib only, Python 3.8+."""


EXCERPT_MAX_LINES = 12

TEXT_MAX = 400


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
