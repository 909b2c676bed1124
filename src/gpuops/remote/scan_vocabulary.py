"""Gate scan: the words a GPU test is made of (tokens, predicate and platform names, the calls that
return the capability) and the cheap text tests built on them. Host code: stdlib only, Python 3.8+."""

import re


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

CAP_NAME_RE = re.compile(r"cap|(^|_)sm($|_)|arch|major|minor|(^|_)cc($|_)|compute", re.I)

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


def indented_matches(pattern, text, word):
    """``pattern.finditer(text)`` for a MULTILINE ``pattern`` that begins ``^[ \t]*`` (or ``+``) then
    ``word``, and whose match never runs into a line where another one begins: the regex is tried
    only at the start of the lines where ``word`` follows the indent (``finditer`` tries it at every
    line of the file, which cost more than all else ``collect_definitions`` does)."""
    starts = []
    at = text.find(word)
    while at != -1:
        start = text.rfind("\n", 0, at) + 1
        if (not starts or starts[-1] != start) and not text[start:at].strip(" \t"):
            starts.append(start)
        at = text.find(word, at + len(word))
    matches = (pattern.match(text, start) for start in starts)
    return [match for match in matches if match is not None]


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
