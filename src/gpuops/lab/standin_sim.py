"""What the lab's stand-in SGLang server simulates (stdlib only, Python 3.8+): its launch flags
as SGLang's fields, the start-up crash and wrong-answer rules, the speed (exact rate or the speed
model), the server's state and the pacing of one generation.

A sibling of ``standin_server.py`` (the HTTP side and ``main``): the lab copies both, with
``speed_model.py`` and ``sglang_argv.py``, into one directory on every simulated host
(``hosts.STANDIN_SIBLINGS``), and the stand-in imports them from there. See standin_server.py's
docstring for the controls and the speed model.
"""

import collections
import json
import math
import os
import sys
import threading
import time

import speed_model  # a sibling (the lab copies it next to this file); stdlib only

# The KV-cache capacity the stand-in reports (tokens): it holds no cache; a real H200 reported
# 10,924,107 for the recorded 45 M-parameter model at --mem-fraction-static 0.6.
SIMULATED_TOKEN_CAPACITY = 1000000

try:  # gpuops' one SGLang argv parser: the lab copies it next to this file (hosts.STANDIN_SIBLINGS)
    import sglang_argv
except ImportError:  # run in place from the package (lab/standin_process.py), by any python: ../remote
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "remote"))
    import sglang_argv


# Flags whose SGLang field name is not the flag spelled with underscores (--tp -> tp_size).
FLAG_ALIASES = {alias: name for name, aliases in sglang_argv.ALIASES.items() for alias in aliases if alias != name}

# A few SGLang defaults, so clients see the fields they look for even when no flag set them.
SERVER_ARG_DEFAULTS = {
    "model_path": None,
    "host": "127.0.0.1",
    "port": 30000,
    "tp_size": 1,
    "dp_size": 1,
    "enable_flashinfer_allreduce_fusion": False,
    "speculative_algorithm": None,
    "speculative_num_steps": None,
    "speculative_eagle_topk": None,
    "speculative_num_draft_tokens": None,
    "disable_cuda_graph": False,
    "trust_remote_code": False,
}

ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_VISIBLE_DEVICES", "GPUOPS_STANDIN_")

FILLER_WORDS = (
    " the", " model", " is", " a", " simulated", " stand", "-in", " and", " these", " tokens",
    " are", " filler", ",", " counted", " exactly", ".",
)


# --------------------------------------------------------------------------- arguments

def _coerce(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    return text


def parse_flags(argv):
    """SGLang-style flags -> {field_name: value}, read by gpuops' one parser (``sglang_argv``),
    values typed as SGLang's would be. Unknown flags are kept, not rejected."""
    words = sglang_argv.launch_args(argv)  # "-m sglang.launch_server ...": we are that module
    flags, positional = sglang_argv.parse_flags(argv if words is None else words)
    if positional:
        raise SystemExit("standin_server: unexpected argument %r" % positional[0])
    fields = {}
    for name, value in flags.items():
        field = FLAG_ALIASES.get(name, name)
        if isinstance(value, list):
            fields[field] = [_coerce(v) for v in value]
        else:
            fields[field] = value if value is True else _coerce(value)
    return fields


def build_server_args(argv):
    fields = dict(SERVER_ARG_DEFAULTS)
    fields.update(parse_flags(argv))
    if not fields.get("model_path"):
        raise SystemExit("launch_server: error: the following arguments are required: --model-path")
    if str(fields.get("speculative_algorithm") or "").upper() == "NGRAM":
        # As SGLang resolves NGRAM's settings at start-up (0.5.8 server_args.py
        # _handle_speculative_decoding, 0.5.16 arg_groups/speculative_hook.py _handle_ngram): its
        # tree's breadth is the eagle topk, 12 draft tokens unless given, steps = tokens // topk.
        fields["speculative_eagle_topk"] = _int_or(fields.get("speculative_ngram_max_bfs_breadth"), 10)
        if fields.get("speculative_num_draft_tokens") is None:
            fields["speculative_num_draft_tokens"] = 12
        if fields.get("speculative_num_steps") is None:
            fields["speculative_num_steps"] = (_int_or(fields["speculative_num_draft_tokens"], 12)
                                               // max(1, fields["speculative_eagle_topk"]))
    return fields


def _int_or(value, default):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def refused_launch(server_args):
    """What the release's ServerArgs raises at start-up for this launch (its ValueError's words), or
    None. One rule, the same text in 0.5.8's server_args.py and 0.5.16's speculative_hook.py: an NGRAM
    tree wider than one branch (topk = speculative_ngram_max_bfs_breadth) over a paged KV cache
    (--page-size > 1) on any attention backend but flashinfer."""
    if str(server_args.get("speculative_algorithm") or "").upper() != "NGRAM":
        return None
    topk = _int_or(server_args.get("speculative_eagle_topk"), 10)
    page_size = _int_or(server_args.get("page_size"), 1)
    if topk > 1 and page_size > 1 and server_args.get("attention_backend") != "flashinfer":
        return ("speculative_eagle_topk(%d) > 1 with page_size(%d) > 1 is unstable and produces incorrect results "
                "for paged attention backends. This combination is only supported for the 'flashinfer' backend."
                % (topk, page_size))
    return None


def reported_env(environ):
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)}


# --------------------------------------------------------------------------- crash rules

def parse_crash_rules(text):
    rules = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit("standin_server: GPUOPS_STANDIN_CRASH_IF item %r is not KEY=VALUE" % item)
        rules.append((key.strip(), value.strip()))
    return rules


def _same(actual, wanted):
    if isinstance(actual, bool):
        return str(actual).lower() == wanted.lower()
    return str(actual) == wanted


def matching_crash_rule(rules, server_args, environ):
    for key, wanted in rules:
        if key in environ and _same(environ[key], wanted):
            return key, wanted
        field = FLAG_ALIASES.get(key.lstrip("-").replace("-", "_"), key.lstrip("-").replace("-", "_"))
        if field in server_args and server_args[field] is not None and _same(server_args[field], wanted):
            return key, wanted
    return None


def crash_message(key, value):
    """A log tail in the manner of a real failure for that setting (wording is our own)."""
    if key.startswith("NCCL_"):
        return (
            "Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "sglang/srt/model_executor/cuda_graph_runner.py", in capture\n'
            "RuntimeError: Capture cuda graph failed: NCCL error: invalid usage "
            "(run with NCCL_DEBUG=WARN for details), NCCL version 2.27.5\n"
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
            "Last error: %s=%s is not supported for this collective during CUDA graph capture\n"
            "Possible solutions: unset %s, or disable CUDA graph by --disable-cuda-graph "
            "(large performance loss)" % (key, value, key)
        )
    return (
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        "RuntimeError: simulated start-up failure because %s=%s" % (key, value)
    )


# --------------------------------------------------------------------------- speed model

def _env_float(environ, name):
    text = environ.get(name)
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        raise SystemExit("standin_server: %s=%r is not a number" % (name, text))


fusion_enabled = speed_model.fusion_enabled


# SGLang 0.5.21+'s PCIe IPC all-reduce, decided as its pcie_ipc_ar.py decides at start-up (the
# texts are that file's log lines; gpuops/pcie_ipc.py holds the same facts for the client side).
PCIE_IPC_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
PCIE_IPC_SGLANG_FILE = os.path.join("srt", "distributed", "device_communicators", "pcie_ipc_ar.py")
PCIE_IPC_ENABLED = ("FlashInfer PCIe-IPC all-reduce enabled (world=%d, workspace sized on first reduction)")
PCIE_IPC_FALLBACK = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm; "
                     "falling back to NCCL all-reduce.")


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def package_dir(name):
    """The directory ``import name`` would load, without importing it (None when absent)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _version_at_least(text, first):
    def parts(v):
        out = []
        for piece in str(v).split(".")[:3]:
            digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
            if not digits:
                break
            out.append(int(digits))
        return tuple(out)
    have = parts(text)
    return bool(have) and have >= parts(first)


def flashinfer_has_pcie_ipc():
    """A real FlashInfer on the path has ``comm/pcie_ipc_ar.py`` or not; the lab's simulated one
    (version data only) answers by its version: 0.7.0 is the first release with the kernels."""
    package = package_dir("flashinfer")
    if package is not None:
        return os.path.isfile(os.path.join(package, "comm", "pcie_ipc_ar.py"))
    try:
        from importlib import metadata
        return _version_at_least(metadata.version("flashinfer-python"), "0.7.0")
    except Exception:
        return False


def pcie_ipc_decision(server_args, environ):
    """(in effect?, the line pcie_ipc_ar.py logs or None) for this launch."""
    if not _truthy(environ.get(PCIE_IPC_ENV, "")):
        return False, None
    sglang = package_dir("sglang")
    if sglang is None or not os.path.isfile(os.path.join(sglang, PCIE_IPC_SGLANG_FILE)):
        return False, None  # a release without it ignores the variable
    tp = server_args.get("tp_size") or 1
    if "SGLANG_USE_1STAGE_ALLREDUCE" in environ:
        deterministic = _truthy(environ["SGLANG_USE_1STAGE_ALLREDUCE"])
    else:
        deterministic = server_args.get("enable_deterministic_inference") is True
    if not isinstance(tp, int) or tp <= 1 or deterministic:
        return False, None
    if tp not in (2, 4, 8):
        return False, None  # logged at debug level only
    if not flashinfer_has_pcie_ipc():
        return False, PCIE_IPC_FALLBACK
    return True, PCIE_IPC_ENABLED % tp


class ServerSpeed(object):
    """One stand-in server's per-request token rate and chunking: the exact-rate control, or the
    lab's one speed model (``speed_model.SpeedModel``) predicting it for this server's settings."""

    def __init__(self, server_args, environ, model=None):
        self.exact_rate = _env_float(environ, "GPUOPS_STANDIN_TOKENS_PER_S")
        if self.exact_rate is not None and self.exact_rate <= 0:
            raise SystemExit("standin_server: GPUOPS_STANDIN_TOKENS_PER_S must be > 0")
        try:
            model = model or speed_model.load()
        except speed_model.SpeedModelError as exc:
            raise SystemExit("standin_server: speed model: %s" % exc)
        self.fixed_ttft_ms = _env_float(environ, "GPUOPS_STANDIN_TTFT_MS")
        slowdown = _env_float(environ, "GPUOPS_STANDIN_CONCURRENCY_SLOWDOWN")
        self.slowdown = float(model.common_value("concurrency_slowdown")) if slowdown is None else slowdown
        self.ttft_base_ms = float(model.common_value("ttft_base_ms"))
        self.ttft_per_token_ms = float(model.common_value("ttft_per_prompt_token_ms"))
        self.pcie_ipc, self.pcie_ipc_line = pcie_ipc_decision(server_args, environ)
        settings = speed_model.settings_from_server(
            server_args, environ, speed_model.model_layers(server_args.get("model_path")), pcie_ipc=self.pcie_ipc)
        shape, reason = model.shape_for(speed_model.read_gpu_doc(environ.get("GPUOPS_LAB_GPU")))
        self.prediction = model.predict(shape, settings, reason)
        self.speculative = settings.speculative
        self.num_steps = settings.num_steps
        self.num_draft_tokens = settings.num_draft_tokens
        self.fusion = settings.fusion
        override = _env_float(environ, "GPUOPS_STANDIN_ACCEPT_LENGTH")
        if self.speculative:
            self.accept_length = override if override else self.prediction.accept_length
        else:
            self.accept_length = 1.0
        # An accept length forced by the control changes the rate of the same cycle.
        self.modelled_rate = self.accept_length * 1000.0 / self.prediction.cycle_ms

    def record(self):
        """What /get_server_info says about where this server's speed comes from."""
        if self.exact_rate is not None:
            return {"name": "exact-rate", "version": 1, "shape": None,
                    "label": "exact rate %g tok/s" % self.exact_rate, "basis": "control",
                    "shape_reason": "GPUOPS_STANDIN_TOKENS_PER_S", "predicted_tokens_per_s": self.exact_rate}
        record = self.prediction.as_record()
        if self.accept_length != self.prediction.accept_length:
            record["accept_length"] = round(self.accept_length, 4)
            record["predicted_tokens_per_s"] = round(self.modelled_rate, 3)
            record["accept_length_from"] = "GPUOPS_STANDIN_ACCEPT_LENGTH"
        return record

    def base_rate(self):
        return self.exact_rate if self.exact_rate is not None else self.modelled_rate

    def rate(self, running):
        """Tokens/s of one request while ``running`` requests decode together."""
        return self.base_rate() / (1.0 + self.slowdown * max(0, running - 1))

    def ttft_s(self, prompt_tokens):
        if self.fixed_ttft_ms is not None:
            return self.fixed_ttft_ms / 1000.0
        return (self.ttft_base_ms + self.ttft_per_token_ms * prompt_tokens) / 1000.0

    def chunk_sizes(self, total):
        """Tokens per streamed chunk: the first token alone, then one verify cycle per chunk."""
        if total <= 0:
            return []
        sizes = [1]
        done, cycle = 1, 0
        while done < total:
            cycle += 1
            size = int(math.floor(cycle * self.accept_length + 1e-9)) - int(
                math.floor((cycle - 1) * self.accept_length + 1e-9))
            size = max(1, min(size, total - done))
            sizes.append(size)
            done += size
        return sizes


# --------------------------------------------------------------------------- server state

class StandinState(object):
    def __init__(self, server_args, environ, version, launch_words=()):
        self.server_args = server_args
        self.launch_words = list(launch_words)
        self.env = reported_env(environ)
        self.version = version
        self.speed = ServerSpeed(server_args, environ)
        self.startup_s = _env_float(environ, "GPUOPS_STANDIN_STARTUP_S") or 0.0
        # A real server's first answer after a start can take long (kernels compiled, graphs
        # captured on first use): the first generation waits this many seconds.
        self.first_answer_s = _env_float(environ, "GPUOPS_STANDIN_FIRST_ANSWER_S") or 0.0
        # A real server's timing (lab/real_timing.py has 0.5.16's, measured on an H200): the port
        # opens only after imports and CUDA-graph capture, each /health runs a generation and
        # sleeps 1 s, and SIGTERM drains before the exit. 0: at once (tests that ask for speed).
        self.listen_after_s = _env_float(environ, "GPUOPS_STANDIN_LISTEN_AFTER_S") or 0.0
        self.health_s = _env_float(environ, "GPUOPS_STANDIN_HEALTH_S") or 0.0
        self.drain_s = _env_float(environ, "GPUOPS_STANDIN_DRAIN_S") or 0.0
        self.answered = False
        fail = _env_float(environ, "GPUOPS_STANDIN_FAIL_AFTER_TOKENS")
        self.fail_after_tokens = None if fail is None else int(fail)
        # Wrong answers: a lab fault for gpuops' correctness smoke check (apply/smoke.py).
        self.wrong = matching_crash_rule(parse_crash_rules(environ.get("GPUOPS_STANDIN_WRONG_IF")),
                                         server_args, environ) is not None
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.running = 0
        self.completed = 0  # generations finished (a simulator's counter: lets tests see progress)
        self.recent = collections.deque(maxlen=64)  # what the last generations really emitted
        # What /metrics counts (standin_surface.metrics_page): SGLang's counters, simulated.
        self.totals = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "verify_calls": 0,
                       "decode_passes": 0, "ttft_sum": 0.0}

    nodes = None  # standin_nodes.NodeGroup: the other nodes of a multi-node server (set by main)

    def ready(self):
        joined = self.nodes is None or self.nodes.joined.is_set()
        return joined and time.monotonic() - self.started >= self.startup_s

    def serves(self, path):
        return self.nodes is None or self.nodes.serves(path)

    def first_answer_wait(self):
        """Sleep ``first_answer_s`` before the first generation only; hang for good once a peer
        node is gone and this leader did not notice (``standin_nodes``: its collective never ends)."""
        while self.nodes is not None and self.nodes.lost.is_set():
            time.sleep(1)
        with self.lock:
            first, self.answered = not self.answered, True
        if first and self.first_answer_s:
            time.sleep(self.first_answer_s)

    def enter(self):
        with self.lock:
            self.running += 1

    def leave(self):
        with self.lock:
            self.running -= 1

    def count_completed(self, decode_tokens, decode_s, ttft_s):
        """A generation finished: keep what the server really did, for tests to hold a client to
        (its first token's time from the request's arrival, its decode span after that token)."""
        with self.lock:
            self.completed += 1
            self.recent.append({"decode_tokens": decode_tokens, "decode_s": round(decode_s, 6),
                                "ttft_s": round(ttft_s, 6)})

    def tally(self, prompt_tokens, tokens, chunks, ttft_s):
        """A generation finished: SGLang's counters (one decode pass per chunk after the first: a
        verify cycle with speculative decoding)."""
        with self.lock:
            t = self.totals
            t["requests"] += 1
            t["prompt_tokens"] += prompt_tokens
            t["generation_tokens"] += tokens
            t["decode_passes"] += max(0, chunks - 1)
            if self.speed.speculative:
                t["verify_calls"] += max(0, chunks - 1)
            t["ttft_sum"] += ttft_s

    def counters(self):
        with self.lock:
            out = dict(self.totals)
            out["running"] = self.running
        out["speculative"] = bool(self.speed.speculative)
        out["accept_length"] = round(self.speed.accept_length, 4)
        # SGLang's spec_accept_rate: accepted drafts / proposed drafts (a cycle drafts num_draft_tokens - 1)
        out["accept_rate"] = round((self.speed.accept_length - 1.0) / max(1, self.speed.num_draft_tokens - 1), 4)
        return out

    def current_running(self):
        with self.lock:
            return self.running

    def loads(self, shape=None):
        """``/v1/loads``: one DP rank; the stand-in queues nothing, so every request it holds is
        running. ``shape`` is the release's row (``sglang_release.load_snapshot_shape``, 0.5.16+:
        its core keys and sections, no aggregate); without one, as 0.5.8 answers
        (``entrypoints/v1_loads.py``: rows and an aggregate)."""
        running = self.current_running()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if shape and shape.get("core"):
            values = {"timestamp": time.time(), "num_running_reqs": running, "max_running_requests": 4096,
                      "max_total_num_tokens": SIMULATED_TOKEN_CAPACITY}
            row = {key: values.get(key, 0) for key in shape["core"]}
            for name in ("memory", "disaggregation", "queues"):  # the sections a plain server sends
                fields = shape["sections"].get(name) or []
                row[name] = {f: ("null" if f == "mode" else 0) for f in fields}
            return {"loads": [row], "timestamp": now, "version": self.version}
        row = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": 0, "num_total_reqs": running,
               "num_used_tokens": 0, "token_usage": 0.0, "gen_throughput": 0.0, "utilization": 0.0}
        return {"timestamp": now, "version": self.version,
                "dp_rank_count": 1, "loads": [row],
                "aggregate": {"total_running_reqs": running, "total_waiting_reqs": 0, "total_reqs": running,
                              "avg_token_usage": 0.0, "avg_throughput": 0.0, "avg_utilization": 0.0}}

    def legacy_load(self, keys=()):
        """``/get_load`` (deprecated since 0.5.8): ``num_reqs`` is running plus waiting per DP rank;
        the keys the release's handler builds (0.5.16 adds ``num_pending_tokens`` and ``ts_tic``)."""
        running = self.current_running()
        values = {"dp_rank": 0, "num_reqs": running, "num_waiting_reqs": 0, "num_tokens": 0,
                  "num_pending_tokens": 0, "ts_tic": time.perf_counter()}
        return [{key: values.get(key, 0) for key in (keys or ("dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"))}]

    def model_info(self, keys=()):
        """``/model_info``: the keys the release's handler answers (without a release, 0.5.8's
        first four), valued as a plain text model; ``model_type``/``architectures`` from the
        model directory's config.json where the host has one."""
        model = self.server_args.get("model_path")
        config = _model_config(model)
        values = {"model_path": model, "tokenizer_path": self.server_args.get("tokenizer_path") or model,
                  "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                  "has_image_understanding": False, "has_audio_understanding": False,
                  "model_type": config.get("model_type"), "architectures": config.get("architectures"),
                  "served_model_name": self.server_args.get("served_model_name") or model}
        info = {key: values.get(key) for key in (keys or ("model_path", "tokenizer_path", "is_generation"))}
        info["simulated"] = True
        return info

    def server_info(self, surface=None):
        # real SGLang flattens its args at the top level: the release's fields, as resolved
        info = surface.server_info(self.server_args, self.launch_words) if surface else dict(self.server_args)
        if not (surface and surface.fields):
            # without the release's fields (no release on the path): the flags as given, under a
            # key of the stand-in's own; with them, the shape of the release and nothing else
            info["server_args"] = dict(self.server_args)
        if surface:
            # What the release spreads in beside its arguments: the scheduler's start-up info and
            # the KV events descriptor (None: publishing off), as a real 0.5.16 answered.
            extras = {"status": "ready", "max_total_num_tokens": SIMULATED_TOKEN_CAPACITY,
                      "max_req_input_len": int(self.server_args.get("context_length") or 4096) - 6,
                      "kv_events": None}
            for key in surface.server_info_keys:
                if key in extras and key not in info:
                    info[key] = extras[key]
        info["env"] = dict(self.env)
        info["version"] = self.version
        info["simulated"] = True
        info["speed_model"] = self.speed.record()
        with self.lock:
            completed = self.completed
            recent = list(self.recent)
        state = {"simulated": True, "decode_tokens_per_s_batch1": round(self.speed.base_rate(), 3),
                 "completed_requests": completed, "recent_generations": recent}
        if self.speed.speculative:
            # The configured average, not a running tally: a tally would be skewed by the short
            # last chunk of every request, and tests compare this figure with the bench's.
            state["avg_spec_accept_length"] = round(self.speed.accept_length, 4)
        info["internal_states"] = [state]
        return info


def _model_config(model_path):
    """The model directory's config.json (a dict; empty when unreadable): bounded, never trusted."""
    try:
        with open(os.path.join(str(model_path), "config.json"), "rb") as handle:
            config = json.loads(handle.read(1 << 20).decode("utf-8", "replace"))
    except (OSError, ValueError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


def count_prompt_tokens(prompt):
    """Simulated tokenizer: whitespace words (token ids when given)."""
    if isinstance(prompt, list):
        if prompt and all(isinstance(x, int) for x in prompt):
            return len(prompt)
        return sum(count_prompt_tokens(p) for p in prompt)
    if isinstance(prompt, str):
        return max(1, len(prompt.split()))
    return 1


def filler_text(start, count, wrong=False):
    """Deterministic text (greedy decoding repeats itself); ``wrong`` shifts it, as a broken kernel would."""
    shift = 3 if wrong else 0
    return "".join(FILLER_WORDS[(start + shift + i) % len(FILLER_WORDS)] for i in range(count))


class GenerationFailed(Exception):
    pass


def generate_chunks(state, prompt_tokens, max_new_tokens):
    """Yield (tokens_so_far, chunk_tokens) on the pacing schedule; raises GenerationFailed."""
    speed = state.speed
    t_arrival = time.monotonic()
    state.enter()
    try:
        deadline = t_arrival + speed.ttft_s(prompt_tokens)
        done = 0
        for index, size in enumerate(speed.chunk_sizes(max_new_tokens)):
            if index > 0:
                deadline += size / speed.rate(state.current_running())
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if state.fail_after_tokens is not None and done + size > state.fail_after_tokens:
                raise GenerationFailed(
                    "simulated failure after %d tokens (GPUOPS_STANDIN_FAIL_AFTER_TOKENS)" % done)
            done += size
            # Stamped as the chunk is handed to the writer: no client can see it earlier. (Stamped
            # after the write, a writer thread preempted in between made a request's TTFT here
            # longer than the client's own, which is measured from before it connected.)
            sent = time.monotonic()
            yield done, size
            if index == 0:
                # Anchor the decode schedule on when the first token really went out, so that
                # a late first token (a starved CPU) is not made up by a burst that would
                # inflate the measured rate.
                deadline = sent
                first_sent, first_size = sent, size
            if done >= max_new_tokens:
                state.count_completed(done - first_size, sent - first_sent, first_sent - t_arrival)
                state.tally(prompt_tokens, done, index + 1, first_sent - t_arrival)
    finally:
        state.leave()
