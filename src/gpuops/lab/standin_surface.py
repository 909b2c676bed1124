"""What the lab's stand-in answers, derived from the SGLang release installed on its host (stdlib
only, Python 3.8+): the routes of that release's ``http_server.py``, the fields of its
``/server_info`` (with ``launch_command`` where the release reports it), the ``sglang:`` series of
its metrics collector, and its ``--api-key`` rule. Read through ``sglang_release`` (copied next to
this file with it: ``hosts.STANDIN_SIBLINGS``); the release is found on the stand-in's
``PYTHONPATH`` and never imported.

Without a readable release (the stand-in run in place by a test) it answers as 0.5.8 did.

Controls (environment):
  GPUOPS_STANDIN_DROP_DEPRECATED  1: the routes the release marks deprecated are not served (a
                                  later release that dropped ``/get_server_info``, ``/get_model_info``)
  GPUOPS_STANDIN_RESOLVE          KEY=VALUE[,...]: what the server's own resolution decided, reported
                                  by ``/server_info`` over what the flags say (SGLang turning a
                                  feature on, or off, by itself)
  GPUOPS_LAB_SURFACES             a folder where what was read from a release is kept (the lab's
                                  ``lib/surfaces``): reading it costs ~120 ms of CPU a start, and
                                  every host of a lab has the same release, hard-linked. A lab name,
                                  not a control: ``/server_info`` reports GPUOPS_STANDIN_* only
"""

import marshal
import os
import random
import re
import sys

try:  # a sibling (the lab copies it next to this file); run in place from the package: ../remote
    import sglang_release
except ImportError:
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "remote"))
    import sglang_release
import scan_fingerprint  # the gate scan's digest of a tree's .py files (a sibling too, or ../remote)


# Served when no release can be read: the routes of 0.5.8 that the stand-in simulates.
FALLBACK_GET = ("/health", "/health_generate", "/ping", "/get_model_info", "/model_info", "/get_server_info", "/server_info",
                "/get_load", "/v1/loads", "/v1/models", "/metrics", "/start_profile", "/stop_profile")
FALLBACK_POST = ("/generate", "/v1/completions", "/v1/chat/completions", "/start_profile", "/stop_profile")
# Routes SGLang answers without the API key (srt/utils/auth.py: decide_request_auth).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def _template(path):
    """A route path with ``{param}`` / ``{param:path}`` parts as a regex."""
    out = ""
    for part in re.split(r"(\{[^}]+\})", path):
        if part.startswith("{") and part.endswith("}"):
            out += ".+" if part.endswith(":path}") else "[^/]+"
        else:
            out += re.escape(part)
    return re.compile("^%s$" % out)


def read_release(root):
    """What the stand-in answers from the release at ``root``, as plain values (marshal keeps them):
    (routes as tuples, server_args fields, launch_command, metric names, /model_info, /get_load and
    /server_info keys, /v1/loads' shape, refused routes); None when the release cannot be read."""
    try:
        routes = [(r.methods, r.path, r.line, r.file, r.needs, r.deprecated)
                  for r in sglang_release.release_routes(root)]
        server_info_keys = sglang_release.answer_keys(root, "server_info")
        if "scheduler_info" in server_info_keys:
            server_info_keys += sglang_release.scheduler_info_keys(root)
        return (routes, sglang_release.server_arg_fields(root), sglang_release.reports_launch_command(root),
                sglang_release.metric_names(root), sglang_release.answer_keys(root, "model_info"),
                sglang_release.answer_keys(root, "get_load"), server_info_keys,
                sglang_release.load_snapshot_shape(root), sglang_release.refused_routes(root))
    except (OSError, SyntaxError, ValueError):
        return None


def kept_release_reading(root, folder):
    """``read_release(root)``, kept in ``folder`` (None: not kept) under the tree's fingerprint (the
    gate scan's: every .py file's path, size, mtime and inode, and the python): reused only while
    every file it could have read is the very one it was read from. A record that does not load, or
    names another fingerprint, is read again and replaced."""
    fingerprint = scan_fingerprint.tree_fingerprint(root, {"reader": "standin_surface"}, None) if folder else None
    if fingerprint is None:
        return read_release(root)
    path = os.path.join(folder, fingerprint + ".marshal")
    try:
        with open(path, "rb") as handle:
            record = marshal.load(handle)
        if record[0] == fingerprint:
            return record[1]
    except (OSError, EOFError, ValueError, TypeError, IndexError, KeyError):
        pass
    read = read_release(root)
    if read is not None:
        try:
            os.makedirs(folder, exist_ok=True)
            partial = "%s.%d" % (path, os.getpid())
            with open(partial, "wb") as handle:
                marshal.dump((fingerprint, read), handle)
            os.replace(partial, path)  # whole or not at all: a start beside this one reads either
        except (OSError, ValueError):
            pass  # not kept: the next start reads the release again
    return read


class Surface(object):
    def __init__(self, environ):
        self.root = sglang_release.find_root()
        drop = environ.get("GPUOPS_STANDIN_DROP_DEPRECATED") in ("1", "true", "yes")
        self.routes = None
        self.fields = {}
        self.launch_command = False
        self.metric_names = set()
        # What the release's handlers answer, read from its source (empty/None: as 0.5.8 answers).
        self.model_info_keys = []
        self.get_load_keys = []
        self.server_info_keys = []
        self.load_shape = None
        self.refused = {}
        read = kept_release_reading(self.root, environ.get("GPUOPS_LAB_SURFACES")) if self.root else None
        if read is not None:
            routes, self.fields, self.launch_command, self.metric_names, self.model_info_keys, \
                self.get_load_keys, self.server_info_keys, self.load_shape, self.refused = read
            self.routes = [sglang_release.Route(*r) for r in routes if not (drop and r[5])]
        if self.routes is None:
            self.routes = [sglang_release.Route(("GET",), p, 0, "fallback", needs="enable_metrics" if p == "/metrics" else None)
                           for p in FALLBACK_GET] + [sglang_release.Route(("POST",), p, 0, "fallback") for p in FALLBACK_POST]
        self.resolved = parse_pairs(environ.get("GPUOPS_STANDIN_RESOLVE"))
        self._patterns = [(r, _template(r.path)) for r in self.routes]

    def route_for(self, method, path, server_args):
        """The release's route for ``method path`` (None: the release has no such route)."""
        for route, pattern in self._patterns:
            if (method in route.methods or (method == "GET" and "HEAD" in route.methods)) and pattern.match(path):
                if route.needs and not server_args.get(route.needs):
                    return None  # /metrics without --enable-metrics: not mounted
                return route
        return None

    def authorised(self, path, headers, server_args):
        """SGLang's --api-key rule: every route but health, readiness and metrics needs the key."""
        key = server_args.get("api_key")
        if not key or path.startswith(OPEN_PREFIXES):
            return True
        return (headers.get("Authorization") or "") == "Bearer %s" % key

    def server_info(self, server_args, launch_words):
        """The release's ``/server_info`` fields (defaults, then the flags, then what resolution decided)."""
        info = dict(self.fields)
        info.update(server_args)
        for key, value in resolved_at_start(server_args).items():
            if key in info and info[key] is None:  # a field the release has, left for start-up to set
                info[key] = value
        info.update(self.resolved)
        if self.launch_command:
            info["launch_command"] = " ".join(launch_words)  # as redact_watermark_command_line joins argv
        return info

    def has_metric(self, name):
        return not self.metric_names or name in self.metric_names


# What SGLang 0.5.16 sets at start-up in fields whose default is None when the launch leaves them
# unset, as the real server reported them on the H200 (tests/fixtures/real/h200-x1/sglang-0.5.16/
# http/server_info.json); chunked_prefill_size is that GPU's (SGLang sizes it by GPU memory).
RESOLVED_AT_START = {
    "chunked_prefill_size": 8192, "device": "cuda", "page_size": 1, "grammar_backend": "xgrammar",
    "custom_weight_loader": [], "encoder_register_urls": [], "encoder_urls": [],
    "encoder_transfer_backend": "zmq_to_scheduler", "expert_distribution_recorder_buffer_size": 1000,
    "mm_feature_transport": "cpu", "mm_process_config": {}, "speculative_moe_runner_backend": "auto",
    "speculative_ngram_capacity": 10000000, "uvicorn_access_log_exclude_prefixes": [],
}


# SGLang draws its random seed once at start-up: one per stand-in process, the same in every answer.
START_SEED = random.randint(0, 1 << 30)


def resolved_at_start(server_args):
    """RESOLVED_AT_START with what follows from the launch: the model path as tokenizer and served
    name, a random seed, and the CUDA-graph plan per phase (0.5.16's ``cuda_graph_config``)."""
    model = server_args.get("model_path")
    off = bool(server_args.get("disable_cuda_graph"))
    decode_bs = int(server_args.get("cuda_graph_max_bs_decode") or server_args.get("cuda_graph_max_bs") or 256)
    prefill_bs = int(server_args.get("cuda_graph_max_bs_prefill") or 8192)

    def phase(disabled, max_bs, backend):
        sizes = [b for b in (1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192) if b <= max_bs]
        return {"backend": "disabled" if disabled else backend, "bs": sizes, "max_bs": max_bs,
                "full_prefill_max_req": None, "tc_compiler": "eager"}

    resolved = dict(RESOLVED_AT_START)
    resolved.update({
        "tokenizer_path": model, "served_model_name": model, "random_seed": START_SEED,
        "cuda_graph_config": {
            "decode": phase(off or server_args.get("disable_decode_cuda_graph"), decode_bs, "full"),
            "prefill": phase(off or server_args.get("disable_prefill_cuda_graph"), prefill_bs, "tc_piecewise")},
    })
    return resolved


def parse_pairs(text):
    from standin_sim import _coerce

    out = {}
    for item in (text or "").split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key.strip():
            out[key.strip()] = _coerce(value.strip())
    return out


TOKENIZER_SERIES = ("sglang:num_requests_total", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                    "sglang:time_to_first_token_seconds")


def metrics_page(surface, counters, server_args):
    """The stand-in's ``/metrics`` in Prometheus text (0.0.4), the series SGLang's collector names
    for what the stand-in simulates, each labelled as SGLang labels them."""
    # Labelled as a real 0.5.16 labelled them on the H200: the tokenizer's series (requests,
    # tokens, time to first token) by engine and model only; the scheduler's by rank as well.
    tokenizer_labels = 'engine_type="unified",model_name="%s"' % str(
        server_args.get("served_model_name") or server_args.get("model_path") or "default").replace('"', "")
    scheduler_labels = tokenizer_labels + ',moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    lines = []

    def labels_of(name):
        return tokenizer_labels if name in TOKENIZER_SERIES else scheduler_labels

    def series(name, kind, value, extra=""):
        if not surface.has_metric(name):
            return
        lines.append("# HELP %s %s" % (name, "simulated by the gpuops stand-in"))
        lines.append("# TYPE %s %s" % (name, kind))
        for label_text, number in (value if isinstance(value, list) else [(extra, value)]):
            lines.append("%s{%s%s} %s" % (name, labels_of(name), label_text, repr(float(number))))

    series("sglang:num_running_reqs", "gauge", counters["running"])
    series("sglang:num_queue_reqs", "gauge", 0)
    series("sglang:token_usage", "gauge", 0.0)
    series("sglang:num_requests_total", "counter", counters["requests"])
    series("sglang:prompt_tokens_total", "counter", counters["prompt_tokens"])
    series("sglang:generation_tokens_total", "counter", counters["generation_tokens"])
    if counters["speculative"]:
        series("sglang:spec_accept_length", "gauge", counters["accept_length"])
        series("sglang:spec_verify_calls_total", "counter", counters["verify_calls"])
        series("sglang:spec_accept_rate", "gauge", counters["accept_rate"])
    graph = "decode_none" if server_args.get("disable_cuda_graph") else "decode_cuda_graph"
    series("sglang:cuda_graph_passes_total", "counter",
           [(',mode="%s"' % graph, counters["decode_passes"]), (',mode="prefill_none"', counters["requests"])])
    for name, total, count in (("sglang:queue_time_seconds", 0.0, counters["requests"]),
                               ("sglang:time_to_first_token_seconds", counters["ttft_sum"], counters["requests"])):
        if not surface.has_metric(name):
            continue
        lines.append("# HELP %s simulated by the gpuops stand-in" % name)
        lines.append("# TYPE %s histogram" % name)
        labels = labels_of(name)
        lines.append('%s_bucket{%s,le="+Inf"} %s' % (name, labels, repr(float(count))))
        lines.append("%s_sum{%s} %s" % (name, labels, repr(float(total))))
        lines.append("%s_count{%s} %s" % (name, labels, repr(float(count))))
    return "\n".join(lines) + "\n"
