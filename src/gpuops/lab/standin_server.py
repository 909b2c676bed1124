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
  GPUOPS_STANDIN_FIRST_ANSWER_S    seconds the first generation waits (a real server compiling on first use)
  GPUOPS_STANDIN_LISTEN_AFTER_S    seconds before the port opens (a real server's imports and CUDA graphs)
  GPUOPS_STANDIN_HEALTH_S          seconds each healthy /health takes (a real 0.5.16: ~1.0)
  GPUOPS_STANDIN_DRAIN_S           seconds from SIGTERM to the exit (a real 0.5.16: ~5)
  GPUOPS_STANDIN_CRASH_IF          KEY=VALUE[,KEY=VALUE...]: when an env var or a flag matches, log a
                                   realistic error and exit 1 at start-up (after STARTUP_S)
  GPUOPS_STANDIN_FAIL_AFTER_TOKENS N: every generation fails with an error chunk after N tokens
  GPUOPS_STANDIN_WRONG_IF          KEY=VALUE[,...] (as CRASH_IF): when a flag or env var matches, the
                                   server starts but answers different text (a kernel change that
                                   broke correctness); otherwise the text is the same for every start
  GPUOPS_STANDIN_ACCEPT_LENGTH     speculative decoding: average accepted tokens per verify cycle
  GPUOPS_STANDIN_CONCURRENCY_SLOWDOWN  per extra running request, how much slower each step is
                                   (default 0.015; 0 keeps an exact rate exact under load)
  GPUOPS_STANDIN_JOIN_TIMEOUT_S    a node of rank > 0: how long it tries node 0's --dist-init-addr
  GPUOPS_STANDIN_LEADER_MISSES_DEAD_WORKER  1 on node 0: a worker gone does not end the leader; it
                                   answers /health on and its generations hang (standin_nodes.py)
  GPUOPS_STANDIN_PROFILE_WRITES    0: /start_profile starts, but no trace is ever written
                                   (standin_profile.py: the profiler and its synthesized trace)

Multi-node (``--nnodes N --node-rank R --dist-init-addr HOST:PORT``): ``standin_nodes.py`` (node 0
healthy once every rank joined it, ranks > 0 serve only /ping and /health*, one node gone ends the
others, or leaves a leader that does not notice).

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

import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The simulation (flags, crash rules, speed, state, pacing) is this file's sibling, copied with it
# (hosts.STANDIN_SIBLINGS); so are speed_model.py and sglang_argv.py, which it imports.
from standin_nodes import NodeArgsError, NodeGroup, die
from standin_profile import START_ROUTE, STOP_ROUTE, StandinProfiler
from standin_surface import Surface, metrics_page
from standin_sim import (
    GenerationFailed,
    StandinState,
    build_server_args,
    count_prompt_tokens,
    crash_message,
    filler_text,
    generate_chunks,
    matching_crash_rule,
    package_dir,
    parse_crash_rules,
    refused_launch,
)


STANDIN_VERSION = "0.5.8"


def log(message):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write("[%s] %s\n" % (stamp, message))
    sys.stdout.flush()


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

    def _send_empty(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send_text(self, status, text, content_type=None):
        """A bare ``Response`` as SGLang's routes send it (no content type unless it set one)."""
        data = text.encode()
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _profile(self, path, body):
        """SGLang's profiler routes (standin_profile: refusals are FastAPI's plain 500)."""
        profiler = self.server.profiler
        status, text = profiler.start(body) if path == START_ROUTE else profiler.stop()
        self._send_text(status, text, None if status == 200 else "text/plain; charset=utf-8")

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

    # ---- routes (those of the installed release: standin_surface)
    def _route(self, method):
        """The path when the release serves ``method path`` and the caller may ask it; else the
        answer is sent here (404 as FastAPI words it, 401 as SGLang's --api-key middleware) and None."""
        path = self.path.split("?", 1)[0]
        surface = self.server.surface
        if not self.state.serves(path):
            self._error(404, "Not Found")  # a node of rank > 0 runs SGLang's dummy health server only
            return None
        if not surface.authorised(path, self.headers, self.state.server_args):
            self._send_json(401, {"error": "Unauthorized"})
            return None
        if surface.route_for(method, path, self.state.server_args) is None:
            self._send_json(404, {"detail": "Not Found"})
            return None
        return path

    def do_GET(self):
        path = self._route("GET")
        if path is None:
            return
        refused = self.server.surface.refused.get(path)
        if refused:  # a route the release keeps only to refuse (0.5.16's /weight_version: 404)
            self._send_json(refused[0], {"object": "error", "message": refused[1], "type": str(refused[0]),
                                         "param": None, "code": refused[0]})
        elif path in ("/health", "/health_generate", "/ready", "/ping"):
            # SGLang answers a bare Response: no body, no content type (0.5.16 on the H200); a
            # healthy answer first runs a 1-token generation and sleeps 1 s (GPUOPS_STANDIN_HEALTH_S).
            ready = self.state.ready()
            if ready and path.startswith("/health"):
                time.sleep(self.state.health_s)
            self._send_empty(200 if ready else 503)
        elif path in ("/model_info", "/get_model_info"):
            self._send_json(200, self.state.model_info(self.server.surface.model_info_keys))
        elif path in ("/server_info", "/get_server_info"):
            self._send_json(200, self.state.server_info(self.server.surface))
        elif path == "/metrics":
            data = metrics_page(self.server.surface, self.state.counters(), self.state.server_args).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif path in (START_ROUTE, STOP_ROUTE):  # api_route(GET, POST): a GET starts with the defaults
            self._profile(path, {})
        elif path == "/v1/loads":
            self._send_json(200, self.state.loads(self.server.surface.load_shape))
        elif path == "/get_load":
            self._send_json(200, self.state.legacy_load(self.server.surface.get_load_keys))
        elif path == "/v1/models":
            model = self.state.server_args.get("served_model_name") or self.state.server_args.get("model_path")
            self._send_json(200, {"object": "list", "data": [
                {"id": model, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                 "root": model, "parent": None,
                 "max_model_len": int(self.state.server_args.get("context_length") or 4096)}]})
        else:  # a route of the release the stand-in does not simulate: answered, and says so
            self._send_json(200, {"simulated": True, "route": path})

    def do_POST(self):
        path = self._route("POST")
        if path is None:
            return
        try:
            body = self._read_json()
        except ValueError as exc:
            self._error(400, str(exc))
            return
        if not self.state.ready():
            self._error(503, "server is starting")
            return
        try:
            if path in ("/generate", "/v1/completions", "/v1/chat/completions"):
                self.state.first_answer_wait()
            if path == "/generate":
                self._native_generate(body)
            elif path == "/v1/completions":
                self._openai(body, chat=False)
            elif path == "/v1/chat/completions":
                self._openai(body, chat=True)
            elif path in (START_ROUTE, STOP_ROUTE):
                self._profile(path, body)
            else:
                self._send_json(200, {"simulated": True, "route": path})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (Ctrl-C on the bench side): nothing to tell it

    def do_PUT(self):
        self._other("PUT")

    def do_DELETE(self):
        self._other("DELETE")

    def _other(self, method):
        path = self._route(method)
        if path is not None:
            self._send_json(200, {"simulated": True, "route": path})

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
                for done, _ in generate_chunks(self.state, prompt_tokens, max_new):  # noqa: B007 (read after the loop)
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
                for done, _ in generate_chunks(self.state, prompt_tokens, max_new):  # noqa: B007 (read after the loop)
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

# ``__version__ = "0.4.0"`` (version.py, older releases) or ``__version__ = version = '0.5.16'``
# (_version.py, which setuptools-scm writes and version.py imports from 0.5 on); not an indented one.
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?(["'])([^"'\n]+)\1""", re.M)


def installed_sglang_version():
    """The version the release on the path reports, as SGLang finds its own: ``sglang/_version.py``,
    else a literal in ``sglang/version.py``, else its metadata (what version.py falls back to). Read as
    text, never imported; importlib.metadata only when neither file says (its import and a walk of
    sys.path took 27 of a start's 290 ms under cProfile, and the suite starts hundreds)."""
    override = os.environ.get("GPUOPS_STANDIN_VERSION")
    if override:
        return override
    package = package_dir("sglang")  # the lab puts the real release on PYTHONPATH
    for name in ("_version.py", "version.py") if package else ():
        try:
            with open(os.path.join(package, name), encoding="utf-8", errors="replace") as source:
                found = _VERSION_LINE.search(source.read(1 << 16))
        except OSError:
            continue
        if found:
            return found.group(2)
    try:
        from importlib import metadata
        return metadata.version("sglang")
    except Exception:
        return STANDIN_VERSION


def sglang_argv_words(argv):
    """The launch words SGLang's ``launch_command`` joins: those after ``-m sglang.launch_server``."""
    import sglang_argv

    words = sglang_argv.launch_args(argv)
    return list(argv if words is None else words)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    server_args = build_server_args(argv)
    environ = dict(os.environ)
    rules = parse_crash_rules(environ.get("GPUOPS_STANDIN_CRASH_IF"))
    version = installed_sglang_version()
    state = StandinState(server_args, environ, version, launch_words=sglang_argv_words(argv))
    log("server_args=ServerArgs(%s)" % ", ".join("%s=%r" % kv for kv in sorted(server_args.items())))
    log("sglang stand-in %s (simulated figures, no GPU work); env: %s" % (
        version, " ".join("%s=%s" % kv for kv in sorted(state.env.items())) or "-"))
    if state.speed.pcie_ipc_line:
        log(state.speed.pcie_ipc_line)
    try:
        state.nodes = NodeGroup(server_args, environ, log, lambda why: die(log, why))
    except NodeArgsError as exc:
        time.sleep(state.startup_s)
        log(str(exc))
        return 1
    bad = matching_crash_rule(rules, server_args, environ)
    if bad is not None:
        time.sleep(state.startup_s)
        log(crash_message(*bad))
        log("Received sigquit from a child process. It usually means the child failed.")
        return 1
    refusal = refused_launch(server_args)
    if refusal is not None:  # as the release's ServerArgs refuses it, before any port opens
        log("Traceback (most recent call last):\n  File \"sglang/srt/server_args.py\", in __post_init__\n"
            "ValueError: " + refusal)
        return 1
    time.sleep(state.listen_after_s)  # imports, weights, CUDA graphs: no port yet, SIGTERM kills at once
    host = str(server_args.get("host") or "127.0.0.1")
    port = int(server_args.get("port") or 30000)
    try:
        httpd = StandinHTTPServer((host, port), StandinHandler)
    except OSError as exc:
        log("ERROR: cannot listen on %s:%d: %s" % (host, port, exc))
        return 1
    httpd.standin_state = state
    httpd.surface = Surface(environ)
    httpd.profiler = StandinProfiler(state.speed, server_args, environ, state.current_running)
    log("routes of %s: %d (%s)" % ("sglang " + version if httpd.surface.root else "the stand-in's own list",
                                   len(httpd.surface.routes), httpd.surface.root or "no release on the path"))
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1})
    serving.daemon = True
    serving.start()
    state.nodes.start()  # node 0 waits at the init address for the others; the others join it
    log("INFO:     Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (host, httpd.server_address[1]))
    log("simulated decode rate %.1f tok/s per request at batch 1 (%s)%s" % (
        state.speed.base_rate(), "stand-in model %s: %s, %s" % (
            state.speed.record()["label"], state.speed.record()["basis"], state.speed.record()["shape_reason"]),
        "; speculative accept length %.2f" % state.speed.accept_length if state.speed.speculative else ""))
    if state.startup_s or state.nodes.multi:
        while not stop.wait(0.05) and not state.ready():
            pass
    if not stop.is_set():
        log("The server is fired up and ready to roll!")
    while not stop.wait(0.5):
        pass
    # SGLang 0.5.16's words on SIGTERM (recorded on the H200), then it drains and exits.
    log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
    time.sleep(state.drain_s)
    log("Gracefully exiting... Remaining number of requests %d." % state.current_running())
    httpd.shutdown()
    httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
