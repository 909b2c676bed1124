"""The gate scanner's whole-tree text search: narrowed to the files of a part of the name already
searched for, or of a token it holds, it finds exactly the files a search of every file finds."""

from gpuops.remote.scan_lookup import SiteLookups
from gpuops.remote.scan_vocabulary import TOKENS

TEXTS = {
    "a.py": b"def forward_hopper_bf16(x):\n    return x\n",
    "b.py": b"from a import forward_hopper_bf16\nforward_hopper_bf16(1)\n",
    "c.py": b"# hopper notes\nuse_hopper = 1\n",
    "d.py": b"x = forward_hopper_bf16_v2  # no token but the name's own\n".replace(b"hopper", b"HOPPER"),
    "e.py": b"is_sm100 = True\nkernel_sm100 = 1\n",
    "f.py": b"kernel_sm100()\n",
    "g.py": b"nothing here\n",
}
NEEDLES = [b"kernel_sm100", b"forward_hopper_bf16", b"hopper_bf16", b"use_hopper", b"forward_hopper_bf16_v2",
           b"def forward_hopper_bf16(", b"is_sm100", b"HOPPER_bf16", b"missing", b"forward", b"capability"]


def _lookups(token_files):
    lookups = SiteLookups()
    lookups.texts = TEXTS
    lookups._token_files = token_files
    return lookups


def test_narrowed_searches_find_what_a_search_of_every_file_finds():
    holding_a_token = sorted(rel for rel, text in TEXTS.items() if any(t.encode() in text for t in TOKENS))
    for token_files in (None, holding_a_token):
        for order in (NEEDLES, list(reversed(NEEDLES))):
            lookups = _lookups(token_files)
            for needle in order:
                assert lookups.files_naming(needle) == sorted(r for r, t in TEXTS.items() if needle in t), needle
