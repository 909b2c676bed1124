"""What a GPU-generation predicate means: read from the release's source, this table as a fallback.

A release says what ``is_sm120_supported`` means in its own ``utils/common.py``
(``partial(_check_cuda_device_version, device_capability_majors=[12], cuda_version=(12, 8))``) and
those meanings change between releases (``is_blackwell`` was SM10x only in 0.4.x, SM10x/SM12x in
0.5.x). The scanner extracts them; ``FALLBACK`` is consulted only for a name the scan found no
definition of (a predicate imported from a package gpuops cannot see, a platform attribute).
"""

from __future__ import annotations

import re
from gpuops.frozen import frozen


@frozen
class Meaning:
    """True on GPUs whose major is in ``majors`` (or whose exact capability is in ``exact``),
    with a CUDA runtime of at least ``min_cuda``; ``at_least`` means major >= majors[0]."""

    majors: tuple[int, ...] = ()
    exact: tuple[tuple[int, int], ...] = ()
    min_cuda: tuple[int, int] | None = None
    at_least: bool = False
    source: str = "table"

    def describe(self) -> str:
        if self.exact:
            what = "/".join(f"sm{a}{b}" for a, b in self.exact)
        elif self.at_least:
            what = f"sm{self.majors[0]}x or newer"
        else:
            what = "/".join(f"sm{m}x" for m in self.majors)
        return what + (f", CUDA >= {self.min_cuda[0]}.{self.min_cuda[1]}" if self.min_cuda else "")


def _m(majors: tuple[int, ...], cuda: tuple[int, int] | None) -> Meaning:
    return Meaning(majors=majors, min_cuda=cuda)


FALLBACK: dict[str, Meaning] = {
    "is_sm80_supported": _m((8,), (11, 0)),
    "is_ampere_with_cuda_12_3": _m((8,), (12, 3)),
    "is_sm90_supported": _m((9,), (12, 3)),
    "is_hopper_with_cuda_12_3": _m((9,), (12, 3)),
    "is_sm100_supported": _m((10,), (12, 8)),
    "is_sm100_or_sm110_supported": _m((10, 11), (12, 8)),
    "is_sm110_supported": _m((11,), (12, 8)),
    "is_sm120_supported": _m((12,), (12, 8)),
    "is_blackwell_supported": _m((10, 11, 12), (12, 8)),
    "is_blackwell": _m((10, 11, 12), (12, 8)),
    "is_sm120": Meaning(exact=((12, 0),)),
    "is_sm121": Meaning(exact=((12, 1),)),
}

# Platform attributes (``get_platform().is_sm100``) as newer releases map them, when the scan did
# not find the release's own table.
PLATFORM_FALLBACK: dict[str, str] = {
    "is_sm90": "is_sm90_supported",
    "is_sm100": "is_sm100_supported",
    "is_sm100_or_sm110": "is_sm100_or_sm110_supported",
    "is_sm110": "is_sm110_supported",
    "is_sm120": "is_sm120_supported",
    "is_blackwell": "is_blackwell_supported",
    "is_hopper": "is_hopper_with_cuda_12_3",
}

_GENERIC_RE = re.compile(r"^is_sm(\d{2,3})(_supported)?(_or_(newer|later|above))?$")


def fallback_meaning(name: str) -> Meaning | None:
    """The table's meaning of a predicate name (``_is_sm100_supported`` reads as ``is_sm100_supported``)."""
    bare = name.lstrip("_")
    if not bare.startswith("is_"):
        bare = "is_" + bare
    if bare in FALLBACK:
        return FALLBACK[bare]
    if bare in PLATFORM_FALLBACK:
        return FALLBACK.get(PLATFORM_FALLBACK[bare])
    match = _GENERIC_RE.match(bare)
    if match:
        number = int(match.group(1))
        major, minor = divmod(number, 10)
        if match.group(3):
            return Meaning(majors=(major,), at_least=True, source="name")
        if minor:
            return Meaning(exact=((major, minor),), source="name")
        return Meaning(majors=(major,), source="name")
    return None


def meaning_from_entry(entry: dict) -> Meaning | None:
    """A scanned ``partial(..., device_capability_majors=[...], cuda_version=(...))`` definition."""
    majors = entry.get("majors")
    if not isinstance(majors, list) or not all(isinstance(m, int) for m in majors):
        return None
    cuda = entry.get("min_cuda")
    min_cuda = (int(cuda[0]), int(cuda[1])) if isinstance(cuda, list) and len(cuda) == 2 else None
    return Meaning(majors=tuple(majors), min_cuda=min_cuda, source=f"{entry.get('file')}:{entry.get('line')}")


def check(meaning: Meaning, major: int, minor: int, cuda: tuple[int, int] | None) -> bool | None:
    """Three-valued: None when the CUDA version decides it and is not known."""
    if meaning.exact:
        hit = (major, minor) in meaning.exact
    elif meaning.at_least:
        hit = bool(meaning.majors) and major >= meaning.majors[0]
    else:
        hit = major in meaning.majors
    if not hit:
        return False
    if meaning.min_cuda is None:
        return True
    if cuda is None:
        return None
    return cuda >= meaning.min_cuda
