"""The bench suites, in one table: what each measures, the options it reads, how it runs (pure).

Adding a suite: one entry here, its host module (``remote/bench_<name>.py``, registered in
``remote/bench_client.SUITES``), its reader (``bench/suite_<name>.py``: how a stored result of it
reads for the headline, ``results compare`` and ``results export``; see ``suite_base``), its result
summary in ``bench/results.py``, and tests. The CLI (``gpuops bench <suite>`` and ``--suite``), the
payload, the runner and the readers of stored results go through this table instead of comparing
suite names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

from gpuops.bench.frames import RemoteRun
from gpuops.bench.record import Headline, JSONObject, ResultDocument, Summary
from gpuops.frozen import frozen

# Options every suite takes: where to run, where results go, repeats, host keys.
COMMON_OPTIONS = ("remote", "inventory", "limit", "as_json", "results_dir", "url", "port", "repeat", "python",
                  "accept_new_host_keys", "known_hosts", "timeout", "connect_timeout")

_REQUEST_OPTIONS = ("api", "input_len", "output_len", "warmup", "seed", "dataset", "dataset_path",
                    "random_range_ratio", "request_timeout", "tool", "tool_args")
_TORCHRUN_OPTIONS = ("world_size", "hidden_size", "tokens", "variant_timeout", "dtype", "env_specs", "iters",
                     "trials", "allreduces_per_step")


@frozen
class Suite:
    """One bench suite of the table: its name and help, the options it reads, and how it runs (under torchrun,
    or as SGLang's profiler)."""

    name: str
    help: str
    options: tuple[str, ...]                  # click parameter names this suite reads (besides COMMON_OPTIONS)
    torchrun_worker: str | None = None        # host module torchrun runs once per NCCL variant
    default_tokens: tuple[int, ...] = ()      # torchrun suites: message sizes when --tokens is not given
    profiles: bool = False                    # runs SGLang's profiler (its load is not what it measures)

    @property
    def torchrun(self) -> bool:
        """One torchrun launch per variant, under a watchdog (frames also kept on the host)."""
        return self.torchrun_worker is not None

    @property
    def sends_requests(self) -> bool:
        """Measures generation requests against the running server (decode, serving)."""
        return not self.torchrun and not self.profiles


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("decode", "One stream at a time: decode rate, TTFT and ITL of each request.",
          _REQUEST_OPTIONS + ("num_requests",)),
    Suite("serving", "Concurrency levels (or Poisson request rates): throughput, latency percentiles, goodput.",
          _REQUEST_OPTIONS + ("concurrency", "requests_per_level", "request_rate", "max_concurrency", "slo")),
    Suite("allreduce", "NCCL all-reduce latency and bus bandwidth per message size, per NCCL variant.",
          _TORCHRUN_OPTIONS + ("cuda_graph", "backend", "kernel"), torchrun_worker="allreduce_bench",
          default_tokens=(1, 4, 8, 16, 64)),
    Suite("fusion", "FlashInfer's fused all-reduce + RMSNorm against the unfused pair, per size.",
          _TORCHRUN_OPTIONS, torchrun_worker="fusion_bench",
          default_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256)),
    Suite("profile", "SGLang's own profiler for a few steps under a small load: where a forward pass's time goes "
                     "(gpuops profile).", ("api", "input_len", "output_len", "seed", "request_timeout"), profiles=True),
)}

NAMES: tuple[str, ...] = tuple(SUITES)
TORCHRUN_NAMES: tuple[str, ...] = tuple(n for n, s in SUITES.items() if s.torchrun)


def suite(name: str) -> Suite:
    """The suite called ``name`` (KeyError for an unknown one: callers validate names first)."""
    return SUITES[name]


def is_torchrun(name: object) -> bool:
    """Whether the suite called ``name`` runs under torchrun (False for a name not registered, as a
    stored result of an unknown suite may carry)."""
    spec = SUITES.get(str(name))
    return spec is not None and spec.torchrun


def sends_requests(name: object) -> bool:
    """Whether the suite called ``name`` measures generation requests (False for an unknown name)."""
    spec = SUITES.get(str(name))
    return spec is not None and spec.sends_requests


def profiles(name: object) -> bool:
    """Whether the suite called ``name`` runs SGLang's profiler (False for an unknown name)."""
    spec = SUITES.get(str(name))
    return spec is not None and spec.profiles


# (figure name, unit, which way is better) -> value; the names are the ones ``results compare``
# shows and under which ``repeats`` stores each figure's interval.
Figures = dict[tuple[str, str, str], "float | None"]
# A figure's values: (what they are over: "requests" | "tokens" | "trials" | "repeats", values).
Distributions = dict[str, tuple[str, list[float]]]
# ``gpuops bench``'s tables: (title, or None for ``bench <suite>``; headers; rows).
BenchTable = tuple["str | None", list[str], list[list[str]]]
# The report's tables: (heading, title, headers, rows).
ReportTable = tuple[str, str, list[str], list[list[str]]]
# The report's plots: (name, title, maker); a maker gets the suite's own results, returns PNG bytes or None.
Plot = tuple[str, str, Callable[[Sequence[ResultDocument]], "bytes | None"]]
# One measured level for ``results export``: (its identity columns, its figures).
ExportLevel = tuple[JSONObject, Mapping[str, object]]


@dataclass
class RunParts:
    """What a suite makes of one run's output (``bench/results.build_result`` adds the rest)."""

    summary: Summary
    levels: list[JSONObject] = field(default_factory=list)     # serving: one per level
    rows: list[JSONObject] = field(default_factory=list)       # allreduce: one per variant and size
    samples: list[JSONObject] | None = None                    # None: the run's own request samples
    errors: list[str] = field(default_factory=list)


class AllreduceSettings(Protocol):
    """What a suite reads of a run's all-reduce options (``options.AllreduceOptions`` has it)."""

    @property
    def backend(self) -> str: ...


class SuiteOptions(Protocol):
    """What a suite reads of a run's options (``options.SuiteOptions`` has it all; declared here, below
    the options, which find each suite through this registry)."""

    @property
    def suite(self) -> str: ...
    @property
    def tool(self) -> str | None: ...
    @property
    def tool_args(self) -> tuple[str, ...]: ...
    @property
    def input_len(self) -> int: ...
    @property
    def output_len(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def slo(self) -> tuple[tuple[str, float], ...]: ...
    @property
    def concurrency(self) -> tuple[int, ...]: ...
    @property
    def requests_per_level(self) -> int | None: ...
    @property
    def request_rates(self) -> tuple[float, ...]: ...
    @property
    def max_concurrency(self) -> int | None: ...
    @property
    def random_range_ratio(self) -> float: ...
    @property
    def allreduce(self) -> AllreduceSettings: ...
    @property
    def profile_steps(self) -> int: ...
    @property
    def profile_stage(self) -> str: ...


@runtime_checkable
class SuiteReader(Protocol):
    """What a suite's client module (``bench/suite_<name>.py``) provides; ``suite_base`` has the defaults
    a module imports where it has nothing of its own.

    For a new run: ``check_options(options)``, ``tool_runs(options)`` (``--tool sglang``),
    ``summarize(run, options)`` and ``finish(run, summary, rows, errors)``. For a stored result:
    ``headline(summary, result)``, ``figures(summary, result)`` (``results compare``),
    ``levels(result)`` (``results export``), ``within_run(result)`` and ``across_repeats(summaries)``
    (the distributions intervals are drawn from), ``merge_repeats(merged, results)`` (``--repeat N``).
    For output: ``bench_tables(hosts)`` (``gpuops bench``), ``PLOTS`` and ``report_tables(results)``.
    """

    PLOTS: tuple[Plot, ...]

    def check_options(self, options: SuiteOptions, /) -> None: ...
    def tool_runs(self, options: SuiteOptions, /) -> tuple[str, str, list[list[str]]]: ...
    def summarize(self, run: RemoteRun, options: SuiteOptions, /) -> RunParts: ...
    def finish(self, run: RemoteRun, summary: Summary, rows: Sequence[JSONObject], errors: Sequence[str], /) -> list[str]: ...
    def headline(self, summary: Summary, result: ResultDocument, /) -> Headline: ...
    def figures(self, summary: Summary, result: ResultDocument, /) -> Figures: ...
    def levels(self, result: ResultDocument, /) -> list[ExportLevel]: ...
    def within_run(self, result: ResultDocument, /) -> Distributions: ...
    def across_repeats(self, summaries: Sequence[Mapping[str, object]], /) -> Distributions: ...
    def merge_repeats(self, merged: ResultDocument, results: Sequence[ResultDocument], /) -> Summary: ...
    def bench_tables(self, hosts: Mapping[str, Headline], /) -> list[BenchTable]: ...
    def report_tables(self, results: Sequence[ResultDocument], /) -> list[ReportTable]: ...


def reader(name: object) -> SuiteReader:
    """How suite ``name`` runs and how a stored result of it reads: the module ``bench/suite_<name>.py``;
    ``suite_base``'s defaults for a name not registered."""
    spec = SUITES.get(str(name))
    module_name = f"gpuops.bench.suite_{spec.name}" if spec is not None else "gpuops.bench.suite_base"
    module = importlib.import_module(module_name)  # deferred: the readers import what reads results
    if not isinstance(module, SuiteReader):
        raise TypeError(f"{module_name} lacks what a suite's reader provides (suites.SuiteReader)")
    return module
