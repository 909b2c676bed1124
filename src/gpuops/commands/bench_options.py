"""The options of `gpuops bench`, defined once: the full set for `gpuops bench --suite NAME` and, for
`gpuops bench NAME`, only those the suite reads (``gpuops.bench.suites`` lists them)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import click

from gpuops import time_limits

DEFAULT_RESULTS_DIR = "results"


def results_dir_option(fn: Any) -> Any:
    return click.option("--results-dir", type=click.Path(file_okay=False), default=DEFAULT_RESULTS_DIR,
                        show_default=True, help="Where results are stored (one JSON file per host and run).")(fn)


# (click parameter name, decorator), in the order --help lists them. The host-selection options come
# from gpuops.commands.options.inventory_options.
BENCH_OPTIONS: list[tuple[str, Callable[[Any], Any]]] = [
    ("remote", click.option("--remote", is_flag=True, help="Run on the inventory's hosts next to their server (else locally against --url).")),
    ("as_json", click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema in `gpuops bench --help` source).")),
    ("results_dir", results_dir_option),
    ("url", click.option("--url", help="Server URL for a local run (default http://127.0.0.1:PORT).")),
    ("port", click.option("--port", type=click.IntRange(1, 65535), help="Server port (default: host var sglang_port, else 30000).")),
    ("api", click.option("--api", type=click.Choice(["native", "completions", "chat"]), default="native", show_default=True,
                  help="native: /generate; completions: /v1/completions; chat: /v1/chat/completions.")),
    ("input_len", click.option("--input-len", type=click.IntRange(1, 10_000_000), default=256, show_default=True)),
    ("output_len", click.option("--output-len", type=click.IntRange(2, 10_000_000), default=256, show_default=True)),
    ("num_requests", click.option("--num-requests", type=click.IntRange(1, 100_000), default=5, show_default=True,
                  help="decode: measured requests, one at a time.")),
    ("warmup", click.option("--warmup", type=click.IntRange(0, 1000), default=2, show_default=True, help="Uncounted warm-up requests.")),
    ("seed", click.option("--seed", type=int, default=0, show_default=True)),
    ("concurrency", click.option("--concurrency", default="1,4,16,64", show_default=True, help="serving: concurrency levels.")),
    ("requests_per_level", click.option("--requests-per-level", type=click.IntRange(1, 1_000_000), help="serving: requests per level (default max(4, 2 x level)).")),
    ("repeat", click.option("--repeat", type=click.IntRange(1, 1000), default=1, show_default=True,
                  help="Run the whole measurement N times: one result with medians and 95% bootstrap intervals.")),
    ("request_rate", click.option("--request-rate", "request_rate", metavar="R1[,R2]",
                  help="serving: Poisson arrivals at each rate (requests/s; inf: all at once) instead of closed-loop levels.")),
    ("max_concurrency", click.option("--max-concurrency", type=click.IntRange(1, 1_000_000),
                  help="serving with --request-rate: at most this many requests in flight.")),
    ("slo", click.option("--slo", metavar="ttft_ms=X,tpot_ms=Y", help="Goodput: requests/s meeting every limit (ttft_ms, tpot_ms, e2e_ms, itl_ms).")),
    ("dataset", click.option("--dataset", type=click.Choice(["random", "sharegpt"]), default="random", show_default=True)),
    ("dataset_path", click.option("--dataset-path", type=click.Path(dir_okay=False), help="sharegpt: a ShareGPT-format JSON file (read here).")),
    ("random_range_ratio", click.option("--random-range-ratio", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
                  help="random: input/output lengths drawn from [len x ratio, len].")),
    ("request_timeout", click.option("--request-timeout", type=click.FloatRange(1, 86400), default=600.0, show_default=True)),
    ("tool", click.option("--tool", type=click.Choice(["sglang"]), help="Run SGLang's own bench_serving / bench_one_batch_server instead.")),
    ("tool_args", click.option("--tool-args", help="Extra arguments for the SGLang tool, one shell-quoted string.")),
    ("python", click.option("--python", "python", metavar="PATH",
                  help="Python on the host for torchrun / the SGLang tool (default: host var sglang_python, else python3).")),
    ("world_size", click.option("--world-size", type=click.IntRange(1, 1024), help="allreduce: ranks (default: the host's GPU count).")),
    ("hidden_size", click.option("--hidden-size", type=click.IntRange(1, 1_000_000), help="allreduce: hidden size (default: the served model's, else 7168).")),
    ("tokens", click.option("--tokens", help="allreduce/fusion: tokens per message (default allreduce 1,4,8,16,64; fusion 1,2,4,...,256).")),
    ("variant_timeout", click.option("--variant-timeout", type=click.FloatRange(1, 86400),
                  help="allreduce/fusion: seconds before a launch counts as hung and is killed (default: from the sizes).")),
    ("dtype", click.option("--dtype", default="bfloat16", show_default=True, help="allreduce: bfloat16, float16 or float32.")),
    ("env_specs", click.option("--env", "env_specs", multiple=True, metavar="KEY=V1[,V2]",
                  help="allreduce: NCCL variant axis (repeatable; the cross product is run).")),
    ("cuda_graph", click.option("--cuda-graph", is_flag=True, help="allreduce: capture the all-reduces in a CUDA graph.")),
    ("backend", click.option("--backend", type=click.Choice(["nccl", "gloo"]), default="nccl", show_default=True,
                  help="allreduce: gloo runs on CPUs.")),
    ("kernel", click.option("--kernel", multiple=True, metavar="nccl|pcie_ipc|custom",
                  help="allreduce: the kernels to measure side by side in each launch (repeatable or comma-separated; "
                       "default nccl): torch.distributed's all-reduce (NCCL), FlashInfer's PCIe IPC all-reduce the way "
                       "SGLang's pcie_ipc_ar.py calls it, SGLang's custom all-reduce (CustomAllreduce); each one that "
                       "cannot run is skipped with the reason.")),
    ("iters", click.option("--iters", type=click.IntRange(1, 100_000), default=50, show_default=True, help="allreduce: calls per trial.")),
    ("trials", click.option("--trials", type=click.IntRange(1, 1000), default=5, show_default=True, help="allreduce: trials (median kept).")),
    ("allreduces_per_step", click.option("--allreduces-per-step", type=click.IntRange(1, 100_000), default=122, show_default=True,
                  help="allreduce: all-reduces in one forward pass (for the per-step cost).")),
    ("accept_new_host_keys", click.option("--accept-new-host-keys", is_flag=True, help="Record unknown SSH host keys (a changed key still fails).")),
    ("known_hosts", click.option("--known-hosts", "known_hosts", multiple=True, type=click.Path(dir_okay=False), help="Extra known_hosts file.")),
    # As apply, rollback, history and tune take them: a host over its time fails alone, the others carry on.
    ("timeout", click.option("--timeout", type=click.FloatRange(1, 86400), default=None, metavar="SECONDS",
                  help="Seconds allowed per host, for everything done there, --repeat included (default: "
                       f"{time_limits.BENCH_S:.0f}; docs/time-limits.md). A host over its time is failed and its bench "
                       "client asked to stop; the others carry on.")),
    ("connect_timeout", click.option("--connect-timeout", "connect_timeout", type=click.FloatRange(1, 600), default=10.0,
                  show_default=True, metavar="SECONDS", help="Seconds allowed to connect to each host.")),
]


def bench_options(names: Iterable[str] | None = None) -> Callable[[Any], Any]:
    """Decorate a command with the bench options named (all of them when ``names`` is None)."""
    wanted = None if names is None else set(names)
    unknown = (wanted or set()) - {n for n, _ in BENCH_OPTIONS} - {"inventory", "limit"}
    if unknown:
        raise ValueError(f"unknown bench options: {sorted(unknown)}")

    def decorate(fn: Any) -> Any:
        for name, option in reversed(BENCH_OPTIONS):
            if wanted is None or name in wanted:
                fn = option(fn)
        return fn

    return decorate
