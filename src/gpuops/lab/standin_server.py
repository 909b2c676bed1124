"""A stand-in for an SGLang server: the same HTTP API, simulated figures, standard library only.

Run like the real thing (the lab's ``sglang_python`` wrapper does exactly this):

    python3 standin_server.py -m sglang.launch_server --model-path /models/Kimi-K2.5 --tp 8 --port 30000 ...

Every SGLang flag it gets is kept verbatim and reported by ``/get_server_info`` under SGLang's
field names (``--tp`` -> ``tp_size``, ``--enable-flashinfer-allreduce-fusion`` ->
``enable_flashinfer_allreduce_fusion``, ...), together with its ``NCCL_*``/``SGLANG_*``
environment and ``"simulated": true``. Nothing here runs a model: the text is filler, the token
counts are exact, and the timing is either an exact rate or the speed model below.

Controls (environment):
  GPUOPS_STANDIN_TOKENS_PER_S      exact decode rate per request (tokens/s); no speed model
  GPUOPS_STANDIN_TTFT_MS           fixed time to first token (default: modelled from prompt length)
  GPUOPS_STANDIN_STARTUP_S         seconds before /health answers 200 (the port is open at once)
  GPUOPS_STANDIN_CRASH_IF          KEY=VALUE[,KEY=VALUE...]: when an env var or a flag matches, log a
                                   realistic error and exit 1 at start-up (after STARTUP_S)
  GPUOPS_STANDIN_FAIL_AFTER_TOKENS N: every generation fails with an error chunk after N tokens
  GPUOPS_STANDIN_WRONG_IF          KEY=VALUE[,...] (as CRASH_IF): when a flag or env var matches, the
                                   server starts but answers different text (a kernel change that
                                   broke correctness); otherwise the text is the same for every start
  GPUOPS_STANDIN_ACCEPT_LENGTH     speculative decoding: average accepted tokens per verify cycle
  GPUOPS_STANDIN_CONCURRENCY_SLOWDOWN  per extra running request, how much slower each step is
                                   (default 0.015; 0 keeps an exact rate exact under load)

Speed model (used when no exact rate is given; every figure is simulated and says so): the
documented figures of ``speed_model.json`` through ``speed_model.py`` (both copied next to this
file), for the shape of the host's GPUs (read from ``$GPUOPS_LAB_GPU``, the replayer's gpu.json;
without one, the "unmeasured" default shape). In short:
  * one step (forward pass) = compute part + all-reduces per step x cost of one all-reduce, the
    cost scaled by tp, by FlashInfer allreduce+RMSNorm fusion (``--enable-flashinfer-allreduce-fusion``
    or an explicit ``--flashinfer-allreduce-fusion-backend`` other than auto/none) and NCCL settings;
  * plain decode yields one token per step; speculative decoding (``--speculative-algorithm``) a
    cycle of ``num_steps`` draft steps and one verify pass yields the accept length;
  * the field report's machine (8x RTX PRO 6000, PCIe) is calibrated on its published figures
    (82 tok/s plain, 60 tok/s EAGLE-3, ~30 ms verify with ~25 ms in 122 all-reduces); every other
    figure says it is an assumption. ``/get_server_info`` reports the model, shape and version
    (``speed_model``), and results keep it.
  * each additional running request makes every step 1.5% slower (mild batching cost).
  * time to first token = 40 ms + 0.08 ms per prompt token.

Pacing: a request's token i is due at ``t_first + sum of step times`` on the monotonic clock (t_first:
when the first token actually went out), and
the writer sleeps until each deadline, so sleep overshoot never accumulates into the rate. With
speculative decoding a chunk carries the tokens of one verify cycle (2 or 3 for an accept length
of 2.18), sent at the deadline of its last token, like a real EAGLE server.
"""

import collections
import json
import math
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import speed_model  # this file's sibling (the lab copies both); stdlib only

try:  # gpuops' one SGLang argv parser: the lab copies it next to this file (hosts.STANDIN_SIBLINGS)
    import sglang_argv
except ImportError:  # run in place from the package (lab/standin_process.py), by any python: ../remote
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "remote"))
    import sglang_argv

STANDIN_VERSION = "0.5.8"


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


def log(message):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write("[%s] %s\n" % (stamp, message))
    sys.stdout.flush()


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
    return fields


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


class SpeedModel(object):
    """Per-request token rate and chunking, from the exact-rate control or the speed model."""

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
        settings = speed_model.settings_from_server(
            server_args, environ, speed_model.model_layers(server_args.get("model_path")))
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
    def __init__(self, server_args, environ, version):
        self.server_args = server_args
        self.env = reported_env(environ)
        self.version = version
        self.speed = SpeedModel(server_args, environ)
        self.startup_s = _env_float(environ, "GPUOPS_STANDIN_STARTUP_S") or 0.0
        fail = _env_float(environ, "GPUOPS_STANDIN_FAIL_AFTER_TOKENS")
        self.fail_after_tokens = None if fail is None else int(fail)
        # Wrong answers: a lab fault for gpuops' correctness smoke check (apply/smoke.py).
        self.wrong = matching_crash_rule(parse_crash_rules(environ.get("GPUOPS_STANDIN_WRONG_IF")),
                                         server_args, environ) is not None
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.running = 0
        self.completed = 0  # generations finished (a simulator's counter: lets tests see progress)
        self.recent = collections.deque(maxlen=16)  # emitted decode spans of the last generations

    def ready(self):
        return time.monotonic() - self.started >= self.startup_s

    def enter(self):
        with self.lock:
            self.running += 1

    def leave(self):
        with self.lock:
            self.running -= 1

    def count_completed(self, decode_tokens, decode_s):
        """A generation finished: keep what the server really did, for tests to hold a client to."""
        with self.lock:
            self.completed += 1
            self.recent.append({"decode_tokens": decode_tokens, "decode_s": round(decode_s, 6)})

    def current_running(self):
        with self.lock:
            return self.running

    def server_info(self):
        info = dict(self.server_args)  # real SGLang flattens its args at the top level
        info["server_args"] = dict(self.server_args)
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
            yield done, size
            sent = time.monotonic()  # the chunk is written: what a client can see at the earliest
            if index == 0:
                # Anchor the decode schedule on when the first token really went out, so that
                # a late first token (a starved CPU) is not made up by a burst that would
                # inflate the measured rate.
                deadline = sent
                first_sent, first_size = sent, size
            if done >= max_new_tokens:
                state.count_completed(done - first_size, sent - first_sent)
    finally:
        state.leave()


# --------------------------------------------------------------------------- HTTP

class StandinHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-standin"
    disable_nagle_algorithm = True  # one small write per token must leave at once, as with uvicorn

    def log_message(self, fmt, *args):  # keep the log readable: one line per request, no noise
        pass

    @property
    def state(self):
        return self.server.standin_state

    # ---- helpers
    def _send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message):
        self._send_json(status, {"error": {"message": message, "code": status}, "object": "error"})

    def _read_json(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            raise ValueError("request body is not JSON")
        if not isinstance(body, dict):
            raise ValueError("request body must be a JSON object")
        return body

    def _start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _event(self, payload):
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(("data: %s\n\n" % data).encode())
        self.wfile.flush()

    # ---- routes
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            if self.state.ready():
                self._send_json(200, {})
            else:
                self._error(503, "server is starting")
        elif path == "/get_model_info":
            self._send_json(200, {
                "model_path": self.state.server_args.get("model_path"),
                "tokenizer_path": self.state.server_args.get("tokenizer_path")
                or self.state.server_args.get("model_path"),
                "is_generation": True,
                "simulated": True,
            })
        elif path == "/get_server_info":
            self._send_json(200, self.state.server_info())
        elif path == "/v1/models":
            model = self.state.server_args.get("served_model_name") or self.state.server_args.get("model_path")
            self._send_json(200, {"object": "list", "data": [
                {"id": model, "object": "model", "owned_by": "sglang", "root": model}]})
        else:
            self._error(404, "no route %s" % path)

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_json()
        except ValueError as exc:
            self._error(400, str(exc))
            return
        if not self.state.ready():
            self._error(503, "server is starting")
            return
        try:
            if path == "/generate":
                self._native_generate(body)
            elif path == "/v1/completions":
                self._openai(body, chat=False)
            elif path == "/v1/chat/completions":
                self._openai(body, chat=True)
            else:
                self._error(404, "no route %s" % path)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (Ctrl-C on the bench side): nothing to tell it

    def _native_generate(self, body):
        prompt = body.get("input_ids") if body.get("input_ids") is not None else body.get("text", "")
        sampling = body.get("sampling_params") or {}
        try:
            max_new = int(sampling.get("max_new_tokens", 128))
        except (TypeError, ValueError):
            self._error(400, "sampling_params.max_new_tokens must be an integer")
            return
        if max_new < 0:
            self._error(400, "sampling_params.max_new_tokens must be >= 0")
            return
        prompt_tokens = count_prompt_tokens(prompt)
        rid = body.get("rid") or uuid.uuid4().hex
        stream = bool(body.get("stream"))

        def meta(done, finished, chunks):
            info = {"id": rid, "prompt_tokens": prompt_tokens, "completion_tokens": done,
                    "cached_tokens": 0, "finish_reason": None}
            if finished:
                info["finish_reason"] = {"type": "length", "length": done}
            if self.state.speed.speculative:
                info["spec_verify_ct"] = max(0, chunks - 1)  # verify cycles of this request
            return info

        if not stream:
            done = chunks = 0
            try:
                for done, _ in generate_chunks(self.state, prompt_tokens, max_new):
                    chunks += 1
            except GenerationFailed as exc:
                self._error(500, str(exc))
                return
            self._send_json(200, {"text": filler_text(0, done, self.state.wrong), "meta_info": meta(done, True, chunks)})
            return
        self._start_stream()
        chunks = 0
        text = ""
        try:
            for done, size in generate_chunks(self.state, prompt_tokens, max_new):
                chunks += 1
                text += filler_text(done - size, size, self.state.wrong)  # cumulative, like SGLang's native stream
                self._event({"text": text,
                             "meta_info": meta(done, done >= max_new, chunks)})
        except GenerationFailed as exc:
            self._event({"error": {"message": str(exc)}})
        self._event("[DONE]")

    def _openai(self, body, chat):
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                self._error(400, "messages must be a non-empty list")
                return
            prompt_tokens = sum(count_prompt_tokens(m.get("content", "")) for m in messages
                                if isinstance(m, dict)) + 4 * len(messages)
        else:
            prompt_tokens = count_prompt_tokens(body.get("prompt", ""))
        limit = body.get("max_completion_tokens") if chat else None
        if limit is None:
            limit = body.get("max_tokens", 16 if not chat else 128)
        try:
            max_new = int(limit)
        except (TypeError, ValueError):
            self._error(400, "max_tokens must be an integer")
            return
        model = body.get("model") or self.state.server_args.get("model_path")
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def usage(done):
            return {"prompt_tokens": prompt_tokens, "completion_tokens": done,
                    "total_tokens": prompt_tokens + done}

        def choice(text, finish, streaming):
            if chat:
                key = "delta" if streaming else "message"
                return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        if not body.get("stream"):
            done = 0
            try:
                for done, _ in generate_chunks(self.state, prompt_tokens, max_new):
                    pass
            except GenerationFailed as exc:
                self._error(500, str(exc))
                return
            self._send_json(200, {"id": cid, "object": kind, "created": created, "model": model,
                                  "choices": [choice(filler_text(0, done, self.state.wrong), "length", False)],
                                  "usage": usage(done)})
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._start_stream()
        done = 0
        try:
            for done, size in generate_chunks(self.state, prompt_tokens, max_new):
                finish = "length" if done >= max_new else None
                chunk = {"id": cid, "object": kind + ".chunk" if chat else kind, "created": created,
                         "model": model, "choices": [choice(filler_text(done - size, size, self.state.wrong), finish, True)]}
                if finish:
                    chunk["usage"] = usage(done)  # the last content chunk always carries usage
                self._event(chunk)
        except GenerationFailed as exc:
            self._event({"object": "error", "message": str(exc), "type": "InternalServerError",
                         "code": 500, "error": {"message": str(exc), "code": 500}})
            self._event("[DONE]")
            return
        if include_usage:
            self._event({"id": cid, "object": kind + ".chunk" if chat else kind, "created": created,
                         "model": model, "choices": [], "usage": usage(done)})
        self._event("[DONE]")


class StandinHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


# --------------------------------------------------------------------------- main

def installed_sglang_version():
    override = os.environ.get("GPUOPS_STANDIN_VERSION")
    if override:
        return override
    try:  # the lab puts the real release on PYTHONPATH; read its metadata without importing it
        from importlib import metadata
        return metadata.version("sglang")
    except Exception:
        return STANDIN_VERSION


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    server_args = build_server_args(argv)
    environ = dict(os.environ)
    rules = parse_crash_rules(environ.get("GPUOPS_STANDIN_CRASH_IF"))
    version = installed_sglang_version()
    state = StandinState(server_args, environ, version)
    log("server_args=ServerArgs(%s)" % ", ".join("%s=%r" % kv for kv in sorted(server_args.items())))
    log("sglang stand-in %s (simulated figures, no GPU work); env: %s" % (
        version, " ".join("%s=%s" % kv for kv in sorted(state.env.items())) or "-"))
    bad = matching_crash_rule(rules, server_args, environ)
    if bad is not None:
        time.sleep(state.startup_s)
        log(crash_message(*bad))
        log("Received sigquit from a child process. It usually means the child failed.")
        return 1
    host = str(server_args.get("host") or "127.0.0.1")
    port = int(server_args.get("port") or 30000)
    try:
        httpd = StandinHTTPServer((host, port), StandinHandler)
    except OSError as exc:
        log("ERROR: cannot listen on %s:%d: %s" % (host, port, exc))
        return 1
    httpd.standin_state = state
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1})
    serving.daemon = True
    serving.start()
    log("Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (host, httpd.server_address[1]))
    log("simulated decode rate %.1f tok/s per request at batch 1 (%s)%s" % (
        state.speed.base_rate(), "stand-in model %s: %s, %s" % (
            state.speed.record()["label"], state.speed.record()["basis"], state.speed.record()["shape_reason"]),
        "; speculative accept length %.2f" % state.speed.accept_length if state.speed.speculative else ""))
    if state.startup_s:
        while not stop.wait(0.05) and not state.ready():
            pass
    if not stop.is_set():
        log("The server is fired up and ready to roll!")
    while not stop.wait(0.5):
        pass
    log("Received SIGTERM; shutting down")
    httpd.shutdown()
    httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
