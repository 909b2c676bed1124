"""A bench result as gpuops writes and reads it (schema ``gpuops.bench.result/1``), as types (pure).

``ResultDocument`` is what ``results.build_result`` writes and what ``result_file.read_result`` hands
on once a file passed its checks. A field is typed as precisely as those checks make it true for any
file (``result_file._SHAPE`` checks each one typed more narrowly than ``object``; a unit test holds
the two together); every other field is ``object`` and is narrowed where it is read (``at``,
``number``, ``figure``, ``mapping``, ``objects``, ``percentiles``): a stored file is trusted no
further than it was checked.

The records a host sends (samples, serving levels, all-reduce and fusion rows, the server's answers)
are ``JSONObject``: JSON objects as parsed, whose values are narrowed where they are read. Keys are
only ever added to the schema, so a document keeps every key it was written with, declared or not.
``Headline`` is one host's line of ``gpuops bench --json``, made from a result. This module imports
nothing of gpuops: every bench module can name these types.
"""

from __future__ import annotations

from typing import Mapping, Sequence, TypedDict

# A JSON object as parsed, from a host or a file: nothing about its values is known until narrowed.
JSONObject = dict[str, object]
# Percentiles of one figure (``{"p50": 9.9, "p90": 11.9, ...}``), as checked in a stored summary.
Percentiles = dict[str, "float | None"]


class Configuration(TypedDict, total=False):
    """What was measured: the fingerprint's inputs, kept in the result so a diff can say what differs.
    Written whole by ``fingerprint.configuration``; in a stored file each part is checked to be of its
    type (``result_file``), and any of them may be missing."""

    server_args: Mapping[str, object] | None   # less the flags that only say where it listens
    env: Mapping[str, object] | None           # the tuning environment, less secrets
    sglang_version: object
    patched_gates: list[str] | None
    extra: Mapping[str, object] | None         # torchrun suites: world size and backend


class SpeedModelRecord(TypedDict, total=False):
    """A stand-in server's speed model (``gpuops/lab/speed_model.json``): what its figures predict from."""

    name: object
    version: object
    shape: object
    label: object
    basis: object
    figures: list[JSONObject] | None


class ServerRecord(TypedDict, total=False):
    """The benched server as it answered (``/server_info``, ``/model_info``, its process)."""

    url: object
    server_args: Mapping[str, object] | None
    env: Mapping[str, object] | None
    version: str | None
    model_path: object
    simulated: object
    internal_states: object
    launch_command: object
    speed_model: SpeedModelRecord | None
    routes: object
    server_info_error: object
    model_info_error: object
    pid: object
    process_cmdline: object
    speculative_in_effect: object


class VariantSummary(TypedDict, total=False):
    """One NCCL variant (or kernel) of an all-reduce summary: its figures per message size (tokens)."""

    label: str
    variant: object
    kernel: object
    ok: object
    error: object
    timed_out: object
    latency_us: Percentiles | None
    busbw_gbps: JSONObject | None
    step_cost_ms: JSONObject | None


class FusionTableRow(TypedDict, total=False):
    """One (size, mode) of a fusion summary: fused against unfused."""

    tokens: int
    cuda_graph: object
    fused_us: object
    unfused_nccl_us: object
    unfused_ipc_us: object
    nccl_allreduce_us: object
    saving_us: object
    speedup: object
    saving_step_ms: object
    fused_step_ms: object
    unfused_nccl_step_ms: object
    rel_err_worst_rank: object
    correct: object


class Summary(TypedDict, total=False):
    """A run's summary: the keys each suite writes (its ``summarize``), grouped by who writes them."""

    # decode and serving: per-request figures (remote/bench_stats.summarize_samples, sglang_tool)
    requests: object
    completed: object
    failed: object
    output_tokens: object
    input_tokens: object
    output_tokens_per_s: float | None
    ttft_ms: Percentiles | None
    tpot_ms: object
    itl_ms: Percentiles | None
    e2e_latency_ms: object
    duration_s: object
    request_throughput: object
    input_tokens_per_s: object
    total_output_tokens_per_s: object
    total_tokens_per_s: object
    slo: object
    slo_met: object
    slo_attainment: object
    goodput_request_per_s: object
    first_error: object
    accept_length: object
    # decode with --tool sglang (bench_one_batch_server)
    batch_size: object
    server_last_gen_throughput: object
    input_len: object
    output_len: object
    tool_record: object
    source: object
    # serving: the levels and their peak
    levels: object
    peak_request_throughput: object
    peak_request_rate: object
    peak_goodput_request_per_s: object
    peak_goodput_concurrency: object
    peak_goodput_total_output_tokens_per_s: object
    peak_total_output_tokens_per_s: object
    peak_concurrency: object
    # allreduce
    variants: list[VariantSummary] | None
    best_variant: object
    ranked_at_tokens: object
    backend: object
    step_cost_ms: object
    # allreduce and fusion
    world_size: object
    hidden_size: object
    cuda_graph: object
    allreduces_per_step: object
    # fusion
    gpu: object
    flashinfer_version: object
    tolerance: object
    all_correct: object
    reasons: list[str] | None
    table: list[FusionTableRow] | None
    headline_tokens: object
    headline_cuda_graph: object
    fused_us: object
    unfused_us: object
    fused_step_ms: object
    unfused_step_ms: object
    saving_step_ms: object
    # profile
    steps: object
    stage_asked: object
    traces: object
    stages: object
    headline: object
    # --repeat N: how many repeats were merged
    repeat: object


class RepeatRecord(TypedDict, total=False):
    """One repeat's own figures in a ``--repeat N`` result (its summary is checked as an object only)."""

    summary: Mapping[str, object] | None
    levels: list[JSONObject] | None


class ServerMetrics(TypedDict, total=False):
    """What the run made the server do, from its ``/metrics`` before and after (``results.server_metrics``)."""

    exposed: object
    deltas: object
    error: object


class KeptTrace(TypedDict, total=False):
    """A raw profiler trace brought home (``--fetch-traces``): where it was written, or why not."""

    file: str
    bytes: int | None
    path: str | None
    error: str


class ResultDocument(TypedDict, total=False):
    """One host's bench run, as stored (``<created>_<host>_<suite>_<id>.json``)."""

    schema: str
    id: str
    run_id: object
    host: str
    suite: str
    tool: str | None
    api: object
    remote: object
    created: str
    ok: bool
    partial: bool | None
    errors: list[str] | None
    notes: list[str] | None
    options: object
    server: ServerRecord | None
    host_facts: object
    configuration: Configuration | None
    fingerprint: str | None
    summary: Summary | None
    levels: list[JSONObject] | None
    allreduce: list[JSONObject] | None
    fusion: list[JSONObject] | None
    samples: list[JSONObject] | None
    server_metrics: ServerMetrics | None
    intervals: Mapping[str, Mapping[str, object] | None] | None  # each read by stats.Interval.from_json
    repeats: list[RepeatRecord] | None
    trace_files: object  # written as a list of KeptTrace; not read back


class Headline(TypedDict, total=False):
    """One host's line of ``gpuops bench --json`` (schema 1; keys are only ever added), made by
    ``results.headline``: what every suite has, the keys each suite adds (its reader's ``headline``),
    then the command's own."""

    ok: bool
    suite: object
    partial: bool
    output_tokens_per_s: object
    ttft_ms: object
    itl_ms: Mapping[str, object]
    accept_length: object
    result_id: str | None
    fingerprint: str | None
    simulated: bool
    speed_model: str | None
    error: str | None
    server_metrics: object
    speculative: object
    # serving
    peak_total_output_tokens_per_s: object
    peak_concurrency: object
    peak_request_throughput: object
    peak_request_rate: object
    peak_goodput_request_per_s: object
    peak_goodput_concurrency: object
    failed: object
    levels: list[JSONObject]
    # allreduce
    best_variant: object
    step_cost_ms: object
    variants: list[JSONObject]
    # fusion
    headline_tokens: object
    fused_us: object
    unfused_us: object
    fused_step_ms: object
    unfused_step_ms: object
    saving_step_ms: object
    all_correct: object
    world_size: object
    hidden_size: object
    # profile
    profile: object
    sentence: str | None
    # gpuops bench: where the result was saved
    result_file: str | None


def at(value: object, *path: str) -> object:
    """What sits at ``path`` in nested JSON objects; None where a key is missing or a step is no object."""
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def number(value: object, *path: str) -> float | None:
    """The number at ``path`` in nested JSON objects, as a float; None when missing or not a number."""
    found = at(value, *path)
    return float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) else None


def figure(value: object) -> float | None:
    """``value`` itself when it is a number (an int stays an int, so it is stored as it came); else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def percentiles(value: object) -> Percentiles | None:
    """``value`` when it is a JSON object of numbers (or nulls) by name, else None."""
    if not isinstance(value, dict):
        return None
    return value if all(figure(v) is not None or v is None for v in value.values()) else None


def mapping(value: object) -> Mapping[str, object]:
    """``value`` when it is a JSON object, else an empty one (a missing or damaged part reads as empty)."""
    return value if isinstance(value, Mapping) else {}


def objects(value: object) -> list[JSONObject]:
    """The JSON objects in ``value`` when it is a list (anything else in it, or no list, left out)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def texts(values: Sequence[object] | None) -> list[str]:
    """Each value as text (``errors`` of a host's records may hold anything JSON can)."""
    return [value if isinstance(value, str) else str(value) for value in values or ()]
