"""The gate scanner's pieces: a file read twice in one scan (loaded, then as another file's lookups
see it) is parsed once, and a piece that does not parse still raises at every reading."""

import pytest

from gpuops.remote.scan_pieces import FileSource, split_pieces

TEXT = '''import torch


def is_sm100_supported():
    return torch.cuda.get_device_capability()[0] == 10


class Plain:
    pass


def use():
    if is_sm100_supported():
        return 1
'''


def test_readings_of_one_scan_share_the_parsed_pieces_and_separate_scans_do_not():
    shared = {}
    first = split_pieces(FileSource("a.py", TEXT, shared), [])
    again = split_pieces(FileSource("a.py", TEXT, shared), [])
    assert [p.line0 for p in first] == [3, 11]  # the pieces naming a token, not the class
    assert [p.tree for p in again] == [p.tree for p in first]  # the same objects: parsed once
    alone = split_pieces(FileSource("a.py", TEXT), [])
    assert [p.line0 for p in alone] == [3, 11]
    assert all(a.tree is not b.tree for a, b in zip(alone, first))
    other_file = split_pieces(FileSource("b.py", TEXT, shared), [])
    assert all(a.tree is not b.tree for a, b in zip(other_file, first))  # a place is a file and a line


def test_a_piece_that_does_not_parse_raises_at_every_reading():
    broken = TEXT.replace("return 1", "return (1")
    shared = {}
    for _ in range(2):
        with pytest.raises(SyntaxError):
            split_pieces(FileSource("a.py", broken, shared), [])
