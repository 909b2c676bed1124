"""The gate scanner's text reads: `import x.y as z` lines (their pieces are not parsed), `self.x = ...` lines."""

from gpuops.remote.scan_fileinfo import _IMPORT_RE, import_lines
from gpuops.remote.scan_values import _SELF_SET_RE
from gpuops.remote.scan_vocabulary import indented_matches

TRICKY = ("import a\n  import b.c as d\nx = 1; import e\n\timport   f.g\nimportlib = 1\n# import h\n"
          "  \t import i as j\nimport\nimport k import l\n\"\"\"\nimport m\n\"\"\"\rimport n\n\x0cimport o\n"
          "def f():\n    import q.r as s  # import t\nimport p")


def test_import_lines_are_the_regex_matches_of_the_whole_text():
    found = [(m.span(), m.groups()) for m in import_lines(TRICKY)]
    assert found == [(m.span(), m.groups()) for m in _IMPORT_RE.finditer(TRICKY)]
    assert [groups for _, groups in found] == [
        ("a", None), ("b.c", "d"), ("f.g", None), ("i", "j"), ("k", None), ("m", None), ("q.r", "s"), ("p", None)]


SELF_SETS = ("class A:\n    self.a\n    = 1\n    self.b: int = 2\n    self.c == 3\n\tself.d=4\nself.e = 5\n"
             "  self.f\n\n  \n  =6\n  x = self.g = 7\n    self.h: Dict[\n")


def test_indented_matches_of_self_attributes_run_over_blank_lines_as_the_regex_does():
    found = [(m.span(), m.groups()) for m in indented_matches(_SELF_SET_RE, SELF_SETS, "self.")]
    assert found == [(m.span(), m.groups()) for m in _SELF_SET_RE.finditer(SELF_SETS)]
    assert [groups[0] for _, groups in found] == ["a", "b", "d", "f"]
