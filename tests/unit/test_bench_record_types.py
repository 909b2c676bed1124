"""``bench/record.py`` types a stored result no more narrowly than ``result_file`` checks it: every
field typed other than ``object`` has its check in ``result_file._SHAPE`` (a type with no check would
let a damaged file through as a value it is not)."""

from __future__ import annotations

from typing import get_type_hints

from gpuops.bench import record
from gpuops.bench.result_file import _SHAPE

# Where each record type sits in a result document ("[]": each element of a list).
_PLACES = {
    "": record.ResultDocument, "server.": record.ServerRecord, "server.speed_model.": record.SpeedModelRecord,
    "configuration.": record.Configuration, "summary.": record.Summary, "summary.variants[].": record.VariantSummary,
    "summary.table[].": record.FusionTableRow, "repeats[].": record.RepeatRecord,
    "server_metrics.": record.ServerMetrics,
}
_CHECKED_ELSEWHERE = {"schema"}  # read_result refuses a file without a gpuops schema first


def test_every_field_typed_narrower_than_object_is_checked() -> None:
    checked = {path for path, _ in _SHAPE}
    unchecked = [f"{prefix}{key}" for prefix, kind in _PLACES.items()
                 for key, hint in get_type_hints(kind).items()
                 if hint is not object and f"{prefix}{key}" not in checked | _CHECKED_ELSEWHERE
                 and key != "trace_files"]
    assert unchecked == []


def test_a_check_on_a_typed_place_names_a_field_the_type_has() -> None:
    """A check of a field no record type declares is a typo (or a field the types lost)."""
    declared = {f"{prefix}{key}" for prefix, kind in _PLACES.items() for key in get_type_hints(kind)}
    stray = [path for path, _ in _SHAPE if path.split("[]")[0].rsplit(".", 1)[0] + "." in _PLACES
             and path.count(".") >= 1 and not path.endswith(("*", "[]")) and path not in declared]
    assert stray == []
