"""What a bench run asks for, and the payload the remote client gets (pure).

``BenchOptions`` holds the suite options as typed values; ``build_payload`` turns them, with what is
known about one host, into the JSON the remote client (``gpuops/remote/bench_client.py``) runs.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import shlex
from dataclasses import asdict, field
from typing import Mapping, Sequence, TypedDict

from gpuops.bench.record import JSONObject
from gpuops.bench.suites import NAMES as SUITES
from gpuops.bench.suites import TORCHRUN_NAMES as TORCHRUN_SUITES
from gpuops.bench.suites import suite as suite_spec
from gpuops.errors import GpuopsError
from gpuops.facts.python_select import sglang_env_pythonpath
from gpuops.bench.suites import reader
from gpuops.frozen import frozen

APIS = ("native", "completions", "chat")
DEFAULT_CONCURRENCY = (1, 4, 16, 64)
DEFAULT_ALLREDUCE_TOKENS = suite_spec("allreduce").default_tokens
DEFAULT_FUSION_TOKENS = suite_spec("fusion").default_tokens
DEFAULT_HIDDEN_SIZE = 7168  # Kimi-K2.5 / DeepSeek-V3, the field report's model family
DEFAULT_ALLREDUCES_PER_STEP = 122  # field report: 122 all-reduces ~ 25 ms per verify pass on 8x PCIe
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DTYPES = ("bfloat16", "float16", "float32")
KERNELS = ("nccl", "pcie_ipc", "custom")


class RequestSpec(TypedDict, total=False):
    """One request of the list the client cycles through (``requests_spec``): its lengths, and from
    ShareGPT its prompt."""

    prompt: str
    input_len: int
    output_len: int


def check_kernels(given: Sequence[str] | str | None) -> tuple[str, ...]:
    """``--kernel`` (repeatable, or comma-separated): the kernels to measure side by side, each
    once, in the order given; NCCL alone when none is given."""
    items = [given] if isinstance(given, str) else list(given or ())
    names = [n.strip() for item in items for n in str(item).split(",") if n.strip()]
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise GpuopsError(f"bench: --kernel {unknown[0]!r} is not one of {', '.join(KERNELS)}")
    return tuple(dict.fromkeys(names)) or ("nccl",)


@frozen
class AllreduceOptions:
    """The options of the torchrun suites (allreduce, fusion): world and message sizes, dtype, the kernels and
    environment variants measured side by side, and the iterations and trials."""

    world_size: int | None = None            # None: the host's GPU count (gloo: 2)
    hidden_size: int | None = None           # None: the served model's config, else 7168
    tokens: tuple[int, ...] = DEFAULT_ALLREDUCE_TOKENS
    dtype: str = "bfloat16"
    env_variants: tuple[tuple[tuple[str, str], ...], ...] = ((),)
    cuda_graph: bool = False
    backend: str = "nccl"
    # allreduce: measured side by side in each launch: "nccl" (torch.distributed), "pcie_ipc"
    # (FlashInfer's PCIe IPC all-reduce, as SGLang calls it), "custom" (SGLang's custom all-reduce)
    kernels: tuple[str, ...] = ("nccl",)
    iters: int = 50
    warmup: int = 10
    trials: int = 5
    allreduces_per_step: int = DEFAULT_ALLREDUCES_PER_STEP
    timeout_s: float | None = None           # per variant; None: from the sizes (see bench_client)


@frozen
class BenchOptions:
    """What a bench run asks for, as typed values: the suite and its options (requests, concurrency, rates,
    dataset, repeats, the all-reduce and profiler options); checked when made."""

    suite: str
    api: str = "native"
    input_len: int = 256
    output_len: int = 256
    num_requests: int = 5               # decode: measured requests, one at a time
    warmup: int = 2                     # requests sent first and not counted
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    requests_per_level: int | None = None  # serving: None -> max(4, 2 x concurrency)
    seed: int = 0
    request_timeout_s: float = 600.0
    tool: str | None = None             # "sglang": run sglang.bench_serving / bench_one_batch_server
    tool_args: tuple[str, ...] = ()
    python: str | None = None           # runs torchrun / the SGLang tool; None: host var sglang_python
    repeat: int = 1                     # the whole measurement N times; one merged result with intervals
    request_rates: tuple[float, ...] = ()  # serving: Poisson arrivals at each rate (req/s; inf: all at once)
    max_concurrency: int | None = None  # serving with --request-rate: cap on requests in flight
    slo: tuple[tuple[str, float], ...] = ()  # goodput: (ttft_ms|tpot_ms|e2e_ms|itl_ms, limit)
    dataset: str = "random"             # random | sharegpt
    dataset_path: str | None = None     # sharegpt: a ShareGPT-format JSON file here at home
    random_range_ratio: float = 1.0     # random: lengths drawn from [len x ratio, len]
    allreduce: AllreduceOptions = field(default_factory=AllreduceOptions)
    profile_steps: int = 5              # profile: the steps SGLang's profiler records per stage
    profile_stage: str = "decode"       # profile: decode | verify | extend | all (what the summary leads with)
    fetch_traces: bool = False          # profile: the raw traces come home too (bounded)
    profile_wait_s: float = 120.0       # profile: how long the host waits for every rank's trace

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise GpuopsError(f"bench: unknown suite {self.suite!r} (one of {', '.join(SUITES)})")
        if self.api not in APIS:
            raise GpuopsError(f"bench: unknown --api {self.api!r} (one of {', '.join(APIS)})")
        for name in ("input_len", "output_len", "num_requests"):
            if getattr(self, name) < 1:
                raise GpuopsError(f"bench: --{name.replace('_', '-')} must be at least 1")
        if self.output_len < 2:
            raise GpuopsError("bench: --output-len must be at least 2 (a decode rate needs two tokens)")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise GpuopsError("bench: --concurrency needs positive integers, e.g. 1,4,16")
        if self.request_rates and "request_rate" not in suite_spec(self.suite).options:
            takers = [name for name in SUITES if "request_rate" in suite_spec(name).options]
            raise GpuopsError(f"bench: --request-rate is for the {' or '.join(takers)} suite, not {self.suite}")
        if any(not r > 0 for r in self.request_rates):
            raise GpuopsError("bench: --request-rate needs positive rates (requests/s, or inf)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise GpuopsError("bench: --max-concurrency must be at least 1")
        if not 0.0 < self.random_range_ratio <= 1.0:
            raise GpuopsError("bench: --random-range-ratio must be in (0, 1]")
        if self.dataset not in ("random", "sharegpt"):
            raise GpuopsError(f"bench: unknown --dataset {self.dataset!r} (random or sharegpt)")
        if (self.dataset == "sharegpt") != bool(self.dataset_path):
            raise GpuopsError("bench: --dataset sharegpt needs --dataset-path FILE (and the path needs the dataset)")
        if self.repeat < 1:
            raise GpuopsError("bench: --repeat must be at least 1")
        if self.tool not in (None, "sglang"):
            raise GpuopsError(f"bench: unknown --tool {self.tool!r} (only 'sglang')")
        if self.tool and self.dataset == "sharegpt":
            raise GpuopsError("bench: --dataset sharegpt is for the built-in client (SGLang's tool reads "
                              "its own --dataset-path on the host: pass it in --tool-args)")
        if self.tool and self.suite in TORCHRUN_SUITES:
            raise GpuopsError(f"bench: --tool sglang runs the decode or serving suite, not {self.suite}")

        reader(self.suite).check_options(self)  # what only one suite refuses

    def as_record(self) -> JSONObject:
        """The options as a result stores them (``options``)."""
        record: JSONObject = asdict(self)
        record["concurrency"] = list(self.concurrency)
        record["tool_args"] = list(self.tool_args)
        record["request_rates"] = list(self.request_rates)
        record["slo"] = dict(self.slo)
        if not suite_spec(self.suite).profiles:
            for name in ("profile_steps", "profile_stage", "fetch_traces", "profile_wait_s"):
                record.pop(name)
        ar = asdict(self.allreduce)
        del record["allreduce"]
        if self.suite in TORCHRUN_SUITES:
            ar["tokens"] = list(self.allreduce.tokens)
            ar["env_variants"] = [dict(v) for v in self.allreduce.env_variants]
            record["allreduce"] = ar
        return record


# --------------------------------------------------------------------------- parsing CLI values

def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise GpuopsError(f"bench: {what} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise GpuopsError(f"bench: {what} must be positive integers, got {text!r}")
    return values


def expand_env_variants(specs: Sequence[str]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """``["NCCL_ALGO=Ring,Tree", "NCCL_PROTO=LL,Simple"]`` -> the cross product, 4 variants."""
    axes: list[list[tuple[str, str]]] = []
    seen: set[str] = set()
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or not _ENV_NAME.match(key):
            raise GpuopsError(f"bench: --env {spec!r} is not KEY=VALUE[,VALUE...]")
        if key in seen:
            raise GpuopsError(f"bench: --env {key} given twice; list its values once, comma-separated")
        seen.add(key)
        options = [v.strip() for v in values.split(",")]
        if any(not v or "\n" in v or "\0" in v for v in options):
            raise GpuopsError(f"bench: --env {spec!r} has an empty or unprintable value")
        axes.append([(key, v) for v in options])
    if not axes:
        return ((),)
    return tuple(tuple(combo) for combo in itertools.product(*axes))


def parse_tool_args(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise GpuopsError(f"bench: --tool-args {text!r}: {exc}") from None


def check_dtype(dtype: str) -> str:
    if dtype not in _DTYPES:
        raise GpuopsError(f"bench: --dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    return dtype


SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


def parse_slo(text: str | None) -> tuple[tuple[str, float], ...]:
    """``ttft_ms=500,tpot_ms=50`` -> (("ttft_ms", 500.0), ("tpot_ms", 50.0))."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in SLO_KEYS:
            raise GpuopsError(f"bench: --slo {text!r}: give {'/'.join(SLO_KEYS)}=MILLISECONDS, comma-separated")
        try:
            limit = float(value)
        except ValueError:
            raise GpuopsError(f"bench: --slo {key}={value!r} is not a number of milliseconds") from None
        if not limit > 0:
            raise GpuopsError(f"bench: --slo {key} must be positive")
        out.append((key, limit))
    return tuple(out)


def parse_rates(text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise GpuopsError(f"bench: --request-rate {text!r}: comma-separated requests/s (or inf)") from None


def request_count(options: BenchOptions) -> int:
    """How many distinct requests a run sends at most (the request list's length)."""
    if "num_requests" in suite_spec(options.suite).options:  # a fixed count (decode)
        return options.num_requests
    caps = [options.max_concurrency or 8] if options.request_rates else list(options.concurrency)
    return options.requests_per_level or max(4, 2 * max(caps))


def requests_spec(options: BenchOptions) -> list[RequestSpec] | None:
    """The per-request list the client cycles through; None for fixed lengths (the client's default).

    random: input/output lengths uniform in [len x ratio, len] (SGLang's --random-range-ratio),
    seeded. sharegpt: first human turn as the prompt, the reply's length as max tokens (4 characters
    per token: gpuops has no tokenizer; every figure uses the server's own token counts).
    """
    if not suite_spec(options.suite).sends_requests:
        return None
    count = request_count(options)
    if options.dataset == "sharegpt":
        return load_sharegpt(str(options.dataset_path), count, options.seed, options.output_len)
    if options.random_range_ratio >= 1.0:
        return None
    import random

    rng = random.Random(options.seed)

    def draw(length: int) -> int:
        return rng.randint(max(int(length * options.random_range_ratio), 1), length)

    return [{"input_len": draw(options.input_len), "output_len": max(2, draw(options.output_len))}
            for _ in range(count)]


def load_sharegpt(path: str, count: int, seed: int, max_output: int) -> list[RequestSpec]:
    import json
    import random

    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise GpuopsError(f"bench: cannot read --dataset-path {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise GpuopsError(f"bench: --dataset-path {path} is not JSON: {exc}") from None
    pairs: list[RequestSpec] = []
    for entry in data if isinstance(data, list) else []:
        turns = entry.get("conversations") or entry.get("conversation") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        prompt, reply = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(reply, str) and prompt.strip() and reply.strip():
            pairs.append({"prompt": prompt, "input_len": max(1, len(prompt) // 4),
                          "output_len": max(2, min(max_output, len(reply) // 4))})
    if not pairs:
        raise GpuopsError(f"bench: --dataset-path {path} has no ShareGPT conversations "
                          '(a list of {"conversations": [{"from": ..., "value": ...}, ...]})')
    random.Random(seed).shuffle(pairs)
    return [pairs[i % len(pairs)] for i in range(count)]


# --------------------------------------------------------------------------- payload

def server_url(port: int, address: str = "127.0.0.1") -> str:
    return f"http://{address}:{int(port)}"


def host_port(host_vars: Mapping[str, object], override: int | None) -> int:
    if override is not None:
        return int(override)
    value = host_vars.get("sglang_port", 30000)
    try:
        if not isinstance(value, (int, float, str)):
            raise TypeError(type(value).__name__)
        return int(value)
    except (TypeError, ValueError):
        raise GpuopsError(f"bench: host var sglang_port={value!r} is not a port number") from None


def tool_runs(options: BenchOptions) -> tuple[str, str, list[list[str]]]:
    """(module, output flag, one argv tail per run) for ``--tool sglang``; user args win. Each
    request suite says its own (``tool_runs`` in ``bench/suite_<name>.py``)."""

    return reader(options.suite).tool_runs(options)


def host_token(host_name: str) -> str:
    """A short per-host tag for file names (lab hosts share one /tmp and one home)."""
    return hashlib.sha256(host_name.encode()).hexdigest()[:8]


def pid_file(run_id: str, host_name: str) -> str:
    """Where a host's client writes its pid; per host too, as lab hosts share one /tmp."""
    return f"/tmp/gpuops-bench-{run_id}-{host_token(host_name)}.pid"


def record_file(run_id: str, host_name: str, state_dir: object = None) -> str:
    """The host's own copy of every frame of a run (``~`` is expanded by the client)."""
    return f"{state_dir or '~/.cache/gpuops'}/bench/{run_id}-{host_token(host_name)}.frames"


def build_payload(
    options: BenchOptions,
    run_id: str,
    url: str,
    host_vars: Mapping[str, object],
    worker_source: str | None = None,
    host_name: str = "localhost",
) -> JSONObject:
    """The JSON the remote client runs for one host."""
    state_dir = host_vars.get("gpuops_state_dir")
    payload: JSONObject = {
        "run_id": run_id,
        "suite": options.suite,
        "url": url,
        "api": options.api,
        "input_len": options.input_len,
        "output_len": options.output_len,
        "num_requests": options.num_requests,
        "warmup": options.warmup,
        "concurrency": list(options.concurrency),
        "requests_per_level": options.requests_per_level,
        "request_rates": list(options.request_rates) or None,
        "max_concurrency": options.max_concurrency,
        "slo": dict(options.slo) or None,
        "requests_spec": requests_spec(options),
        "seed": options.seed,
        "request_timeout": options.request_timeout_s,
        "pid_file": pid_file(run_id, host_name),
        "progress_file": progress_file(run_id, host_name),
        "server_pid_file": f"{state_dir}/sglang.pid" if state_dir else None,
        "state_dir": str(state_dir) if state_dir else None,
        "host_facts": True,
        # torchrun suites also keep every frame on the host (a hung or cut run loses nothing there);
        # not decode/serving, whose runs must leave the host as they found it (tune checks bytes)
        "record_file": record_file(run_id, host_name, state_dir) if options.suite in TORCHRUN_SUITES else None,
    }
    python = options.python or str(host_vars.get("sglang_python") or "python3")
    payload["server_python"] = str(host_vars["sglang_python"]) if host_vars.get("sglang_python") else None
    # the stack the server imports: its PYTHONPATH as gpuops launches it, for when no server runs
    # to read it from (a running server's own environment comes first, on the host)
    payload["server_pythonpath"] = sglang_env_pythonpath(host_vars)
    if suite_spec(options.suite).profiles:
        payload.update(profile_steps=options.profile_steps, profile_stage=options.profile_stage,
                       fetch_traces=options.fetch_traces, profile_wait_s=options.profile_wait_s)
    if options.tool:
        module, output_flag, runs = tool_runs(options)
        payload["tool"] = {"module": module, "python": python, "runs": runs, "output_flag": output_flag}
    if options.suite in TORCHRUN_SUITES:
        ar = options.allreduce
        if worker_source is None:
            raise GpuopsError(f"bench: the {options.suite} suite needs its worker source")
        payload["allreduce"] = {
            "kind": options.suite,
            "timeout_s": ar.timeout_s,
            "worker_source": worker_source,
            "python": python,
            "world_size": ar.world_size,
            "hidden_size": ar.hidden_size,
            "tokens": list(ar.tokens),
            "dtype": ar.dtype,
            "variants": [dict(v) for v in ar.env_variants],
            "cuda_graph": ar.cuda_graph,
            "backend": ar.backend,
            "kernels": list(ar.kernels),
            "iters": ar.iters,
            "warmup": ar.warmup,
            "trials": ar.trials,
            "allreduces_per_step": ar.allreduces_per_step,
        }
    return payload


def progress_file(run_id: str, host_name: str) -> str:
    """The client's progress file (JSON: done, total, stage), removed when it ends."""
    return f"/tmp/gpuops-bench-{run_id}-{host_token(host_name)}.progress"


def progress_command(run_id: str, host_name: str = "localhost") -> str:
    return f"cat {shlex.quote(progress_file(run_id, host_name))} 2>/dev/null; true"


def stop_command(run_id: str, host_name: str = "localhost") -> str:
    """Shell text that asks a running client to stop and report what it measured (SIGINT)."""
    path = shlex.quote(pid_file(run_id, host_name))
    return f'p=$(cat {path} 2>/dev/null) && kill -INT "$p" 2>/dev/null; true'
