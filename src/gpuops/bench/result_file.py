"""One stored result file, read as untrusted: what the results store hands on is a JSON object of
the result schema whose every field the commands read has the type they expect, and whose figures
are finite numbers of a real size. Anything else is a ``BadResult`` with one reason (the store lists
the file with it and goes on with the rest).

A result file is written by gpuops, but it lives at home where anything can happen to it: a copy cut
short, an editor, another tool's JSON in the same folder, a disk that filled, a FIFO or a link to
a device under a result's name. None of that may cost more than its own line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator, Mapping, TypeGuard

from gpuops.bench.record import ResultDocument, Summary
from gpuops.remote.scan_read import NotRead, read_regular
from gpuops.frozen import frozen

SCHEMA_PREFIX = "gpuops.bench.result/"

# The largest stored result here is 157,597 bytes (benchmarks/results/h200-x2/repeat, a fusion run);
# a serving run keeps every token's arrival (~22 bytes a token), so 10,000 requests of 2,048 tokens
# would be ~450 MB. 1 GiB leaves room for any real one and keeps a sparse file, a link to
# /dev/zero or a FIFO named *.json from being read without end (gpuops.remote.scan_read).
FILE_BYTES_MAX = 1 << 30

# No figure gpuops measures comes near 1e15 (tok/s, ms, us, GB/s, bytes of one message, requests,
# tokens): a number that large is a damaged or forged file, not a measurement, and neither is NaN or
# an infinity. Such a figure is read as missing (null: "-" in every table) and the commands say where
# it was. Checked in the parts that hold figures, not in the host facts or the server's settings.
ABSURD = 1e15
_FIGURE_PARTS = ("summary", "levels", "allreduce", "fusion", "samples", "intervals", "repeats")
# The one infinity that is a value: SGLang's bench_serving sends every request at once with its
# default --request-rate inf, and its record (and so the level and the summary) says Infinity
# (the real 0.5.16 run in benchmarks/results/h200-x1/real-sglang/call4). Shown as "inf".
_UNLIMITED = ("request_rate", "peak_request_rate")


class BadResult(Exception):
    """Why a file in the results folder is not a result gpuops can read, in a few words."""


@frozen
class ResultFile:
    """A stored result that passed the checks, with the figures in it read as missing (NaN, infinite, absurd)."""

    document: ResultDocument
    flagged: tuple[str, ...]  # figures read as missing: "summary.ttft_ms.p50 is NaN"


_NONE = type(None)
_NUMBER = (int, float)
# The fields the results commands (list, show, compare, export, report) read, with the types they
# read them as. "a.b": key b of object a; "[]": every element of a list; "*": every value of an object.
# What passes is a ``record.ResultDocument``: each field it types more narrowly than ``object`` is here.
_SHAPE: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("id", (str,)), ("host", (str,)), ("suite", (str,)), ("created", (str,)), ("ok", (bool,)),
    ("partial", (bool, _NONE)), ("tool", (str, _NONE)), ("fingerprint", (str, _NONE)),
    ("errors", (list, _NONE)), ("errors[]", (str,)), ("notes", (list, _NONE)), ("notes[]", (str,)),
    ("server", (dict, _NONE)), ("server.version", (str, _NONE)), ("server.speed_model", (dict, _NONE)),
    ("server.server_args", (dict, _NONE)), ("server.env", (dict, _NONE)),
    ("server.speed_model.figures", (list, _NONE)), ("server.speed_model.figures[]", (dict,)),
    ("configuration", (dict, _NONE)), ("configuration.server_args", (dict, _NONE)),
    ("configuration.env", (dict, _NONE)), ("configuration.patched_gates", (list, _NONE)),
    ("configuration.patched_gates[]", (str,)), ("configuration.extra", (dict, _NONE)),
    ("summary", (dict, _NONE)), ("summary.output_tokens_per_s", _NUMBER + (_NONE,)),
    ("summary.ttft_ms", (dict, _NONE)), ("summary.ttft_ms.*", _NUMBER + (_NONE,)),
    ("summary.itl_ms", (dict, _NONE)), ("summary.itl_ms.*", _NUMBER + (_NONE,)),
    ("summary.variants", (list, _NONE)), ("summary.variants[]", (dict,)), ("summary.variants[].label", (str,)),
    ("summary.variants[].latency_us", (dict, _NONE)), ("summary.variants[].latency_us.*", _NUMBER + (_NONE,)),
    ("summary.variants[].busbw_gbps", (dict, _NONE)), ("summary.variants[].step_cost_ms", (dict, _NONE)),
    ("summary.table", (list, _NONE)), ("summary.table[]", (dict,)), ("summary.table[].tokens", (int,)),
    ("summary.reasons", (list, _NONE)), ("summary.reasons[]", (str,)),
    ("levels", (list, _NONE)), ("levels[]", (dict,)), ("levels[].ttft_ms", (dict, _NONE)),
    ("levels[].itl_ms", (dict, _NONE)),
    ("allreduce", (list, _NONE)), ("allreduce[]", (dict,)), ("allreduce[].variant", (dict, _NONE)),
    ("allreduce[].tokens", (int, _NONE)), ("allreduce[].latency_us_trials", (list, _NONE)),
    ("fusion", (list, _NONE)), ("fusion[]", (dict,)), ("fusion[].tokens", (int, _NONE)),
    ("samples", (list, _NONE)), ("samples[]", (dict,)), ("samples[].chunks", (list, _NONE)),
    ("intervals", (dict, _NONE)), ("intervals.*", (dict, _NONE)),
    ("repeats", (list, _NONE)), ("repeats[]", (dict,)), ("repeats[].summary", (dict, _NONE)),
    ("repeats[].levels", (list, _NONE)), ("repeats[].levels[]", (dict,)),
    ("server_metrics", (dict, _NONE)),
)

_TYPE_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number", dict: "an object",
               list: "a list", _NONE: "null"}


def _kind(value: object) -> str:
    for kind, name in _TYPE_NAMES.items():
        if type(value) is kind:  # exactly: True is an int as well
            return name
    return type(value).__name__


def _at(value: object, parts: list[str], where: str) -> Iterator[tuple[str, object]]:
    """(where, value) of every value at the path ``parts`` below ``value`` (absent keys skipped)."""
    if not parts:
        yield where, value
        return
    head, rest = parts[0], parts[1:]
    if head == "[]":
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from _at(item, rest, f"{where}[{index}]")
    elif head == "*":
        if isinstance(value, dict):
            for key, item in value.items():
                yield from _at(item, rest, f"{where}.{key}")
    elif isinstance(value, dict) and head in value:
        yield from _at(value[head], rest, f"{where}.{head}" if where else head)


def _wanted(types: tuple[type, ...]) -> str:
    names = ["a number" if t is int and float in types else _TYPE_NAMES[t] for t in types if t is not float]
    return " or ".join(names)


def _split(path: str) -> list[str]:
    return [p for p in path.replace("[]", ".[]").split(".") if p]


def shape_problem(document: Mapping[str, object]) -> str | None:
    """The first field the commands would read as something it is not, said in words; None if none."""
    for path, types in _SHAPE:
        for where, value in _at(document, _split(path), ""):
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                return f"{where} is {_kind(value)}, not {_wanted(types)}"
    if not document["id"]:
        return "id is empty"
    return None


def is_summary(summary: Mapping[str, object]) -> TypeGuard[Summary]:
    """Whether ``summary`` reads as a result's summary: every field ``_SHAPE`` names in one of its type."""
    return shape_problem({"id": "-", "summary": summary}) is None


def _is_result(document: dict[str, object]) -> TypeGuard[ResultDocument]:
    """Whether ``document`` reads as a result: every field ``_SHAPE`` names is of its type."""
    return shape_problem(document) is None


def clean_figures(document: Mapping[str, object]) -> list[str]:
    """Put null (read as missing: "-" in tables) in place of every figure that is NaN, infinite
    (but an unlimited request rate) or at or beyond ``ABSURD``, in the document itself (a dict, as
    parsed); the places, said in words."""
    flagged: list[str] = []

    def clean(value: object, where: str, figures: bool) -> object:
        if isinstance(value, dict):
            for key in list(value):
                value[key] = clean(value[key], f"{where}.{key}" if where else str(key), figures or not where and key in _FIGURE_PARTS)
            return value
        if isinstance(value, list):
            for index, item in enumerate(value):
                value[index] = clean(item, f"{where}[{index}]", figures)
            return value
        if not figures or not isinstance(value, _NUMBER) or isinstance(value, bool):
            return value
        if value == math.inf and where.rsplit(".", 1)[-1] in _UNLIMITED:
            return value
        if isinstance(value, float) and not math.isfinite(value):
            flagged.append(f"{where} is {json.dumps(value)}")  # NaN, Infinity: as the file spells them
            return None
        if abs(value) >= ABSURD:
            flagged.append(f"{where} is {value:.3g} (no real figure reaches {ABSURD:.0e})")
            return None
        return value

    clean(document, "", False)
    return flagged


def read_result(path: Path) -> ResultFile:
    """The result stored at ``path``, checked and cleaned; ``BadResult`` with the reason otherwise."""
    try:
        raw = read_regular(str(path), FILE_BYTES_MAX)
    except NotRead as exc:
        raise BadResult(str(exc)) from None
    if not raw.strip():
        raise BadResult("empty file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadResult(f"not UTF-8 (byte {exc.start})") from None
    try:
        document = json.loads(text)
    except RecursionError:
        raise BadResult("not JSON (nested too deep)") from None
    except json.JSONDecodeError as exc:
        # Cut short (a copy or a write that did not finish): the text ends where a value goes on.
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            raise BadResult(f"truncated JSON (it ends at byte {len(raw)} inside a value)") from None
        raise BadResult(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(document, dict):
        raise BadResult(f"not a result (the file holds {_kind(document)}, not an object)")
    schema = document.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise BadResult(f"not a gpuops result (schema {schema!r}, not {SCHEMA_PREFIX}...)")
    if "id" not in document:
        raise BadResult("not a result (no id)")
    try:
        flagged = clean_figures(document)  # first: a NaN where a number is expected is a flag, not a bad file
    except RecursionError:
        raise BadResult("nested too deep to be a result") from None
    if not _is_result(document):
        raise BadResult(shape_problem(document) or "not a result")
    return ResultFile(document, tuple(flagged))
