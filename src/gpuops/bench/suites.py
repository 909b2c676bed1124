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
from dataclasses import dataclass
from types import ModuleType

# Options every suite takes: where to run, where results go, repeats, host keys.
COMMON_OPTIONS = ("remote", "inventory", "limit", "as_json", "results_dir", "url", "port", "repeat", "python",
                  "accept_new_host_keys", "known_hosts", "timeout", "connect_timeout")

_REQUEST_OPTIONS = ("api", "input_len", "output_len", "warmup", "seed", "dataset", "dataset_path",
                    "random_range_ratio", "request_timeout", "tool", "tool_args")
_TORCHRUN_OPTIONS = ("world_size", "hidden_size", "tokens", "variant_timeout", "dtype", "env_specs", "iters",
                     "trials", "allreduces_per_step")


@dataclass(frozen=True)
class Suite:
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


def reader(name: object) -> ModuleType:
    """How a stored result of suite ``name`` reads: the module ``bench/suite_<name>.py`` (its
    ``headline``, ``figures``, ``levels``); ``suite_base``'s defaults for a name not registered."""
    spec = SUITES.get(str(name))
    module = f"gpuops.bench.suite_{spec.name}" if spec is not None else "gpuops.bench.suite_base"
    return importlib.import_module(module)  # deferred: the readers import what reads results
