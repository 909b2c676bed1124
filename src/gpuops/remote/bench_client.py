"""Benchmark client that runs ON the host, next to the SGLang server (stdlib only, Python 3.8+).

Shipped on stdin by ``gpuops bench`` with a JSON payload (see ``gpuops.bench.payload``); it talks to
the server over loopback so the network between the operator and the host is never measured.

Output is framed, one line per record, so that a run cut short (Ctrl-C on the operator's side sends
SIGINT to this process through its pid file) still leaves every finished measurement parseable:

    GPUOPS-BENCH <run_id> <kind> <json>

kinds: ``start``, ``server`` (its /get_server_info and /get_model_info), ``host`` (a light facts
snapshot), ``sample`` (one measured request), ``level`` (a serving concurrency level finished),
``allreduce`` (one all-reduce measurement), ``fusion`` (one fused-vs-unfused measurement),
``progress`` (which level or variant starts), ``tool`` (a line of sglang.bench_* JSONL output),
``note``, ``error``, ``end`` (with ``"partial": true`` when interrupted).

Measurement rules: warm-up requests are not counted; token counts come from the server's own
``meta_info``/``usage``; with speculative decoding a chunk may carry several tokens, so inter-token
latency is the chunk gap divided by the tokens it carried, once per token.
"""

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

FRAME = "GPUOPS-BENCH"
ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_", "TORCH_", "FLASHINFER_", "SGL_")
PROMPT_WORDS = ("alpha", "river", "stone", "cloud", "maple", "signal", "copper", "orbit", "lantern",
                "meadow", "falcon", "harbor", "cipher", "ember", "glacier", "violet")


class Interrupted(Exception):
    pass


KEEP_FRAMES_DAYS = 30


def prune_old_frames(folder, days=KEEP_FRAMES_DAYS):
    """Remove this client's own frames files older than ``days`` (the host's copies do not pile up)."""
    cutoff = time.time() - days * 86400
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.endswith(".frames"):
            path = os.path.join(folder, name)
            try:
                if os.path.getmtime(path) < cutoff:
                    os.unlink(path)
            except OSError:
                pass


class Emitter(object):
    """Writes frames; one lock so threads never interleave half lines."""

    def __init__(self, run_id, stream=None):
        self.run_id = run_id
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()
        self.on_broken = None  # called once stdout is gone: nobody will read the results
        self.keep = None  # the host's copy of every frame (a file), so a lost connection loses nothing
        self.progress = None  # {"done", "total", "stage", ...}: written to progress_path as frames go by
        self.progress_path = None
        self.progress_written = 0.0

    def track(self, path, total):
        """Keep a small JSON progress file at ``path`` (read by the operator's progress display)."""
        self.progress_path = path
        self.progress = {"done": 0, "total": total, "stage": "", "started": time.time()}
        self.write_progress(force=True)

    def write_progress(self, force=False):
        if not self.progress_path or (not force and time.time() - self.progress_written < 0.5):
            return
        self.progress_written = time.time()
        try:
            tmp = self.progress_path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(self.progress, handle)
            os.rename(tmp, self.progress_path)
        except OSError:
            self.progress_path = None  # progress is a courtesy; never a reason to fail

    def untrack(self):
        path, self.progress_path = self.progress_path, None
        for name in (path, path and path + ".tmp"):
            if name:
                try:
                    os.unlink(name)
                except OSError:
                    pass

    def keep_on_host(self, path):
        """Also append every frame to ``path`` on this host; a failure to do so is only noted."""
        try:
            path = os.path.expanduser(path)
            parent = os.path.dirname(path)
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, 0o700)
            prune_old_frames(parent)
            self.keep = open(path, "a")
            return path
        except OSError as exc:
            self.keep = None
            return "not kept (%s)" % exc

    def emit(self, kind, record):
        line = "%s %s %s %s\n" % (FRAME, self.run_id, kind, json.dumps(record, separators=(",", ":")))
        with self.lock:
            if self.progress is not None:
                if kind in ("sample", "allreduce", "fusion"):
                    self.progress["done"] += 1
                elif kind == "progress":
                    self.progress["stage"] = progress_stage(record)
                self.write_progress(force=kind == "progress")
            if self.keep is not None:
                try:
                    self.keep.write(line)
                    self.keep.flush()
                except (OSError, ValueError):
                    self.keep = None
            try:
                self.stream.write(line)
                self.stream.flush()
            except (BrokenPipeError, OSError, ValueError):
                # The operator went away (SSH closed): stop measuring for nobody.
                if self.on_broken is not None:
                    self.on_broken()


def progress_stage(record):
    """A short label for what is running: a concurrency level, a request rate or a variant."""
    if "variant" in record:
        label = " ".join("%s=%s" % kv for kv in sorted((record.get("variant") or {}).items())) or "default"
        return "variant %s (%d/%d)" % (label, record.get("index", 0) + 1, record.get("total", 1))
    if record.get("request_rate") is not None:
        return "rate %g/s (%d/%d)" % (record["request_rate"], record.get("level", 0) + 1, record.get("levels", 1))
    return "c=%s (%d/%d)" % (record.get("concurrency"), record.get("level", 0) + 1, record.get("levels", 1))


def expected_records(payload):
    """How many sample/measurement frames a run sends when it completes (the progress total)."""
    suite = payload.get("suite")
    if payload.get("tool"):
        return None
    if suite == "decode":
        return int(payload.get("num_requests", 5))
    if suite == "serving":
        total = 0
        for concurrency, _ in serving_levels(payload):
            total += int(payload.get("requests_per_level") or max(4, 2 * (concurrency or 8)))
        return total
    if suite in ("allreduce", "fusion"):
        spec = payload.get("allreduce") or {}
        per = len(spec.get("tokens") or []) * (2 if suite == "fusion" else 1)
        return per * len(spec.get("variants") or [{}])
    return None


# --------------------------------------------------------------------------- HTTP

class ServerError(Exception):
    pass


def split_url(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "") or not parts.hostname:
        raise ServerError("unsupported server URL %r (http://HOST:PORT)" % url)
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def http_json(url, path, body=None, timeout=30.0):
    host, port, base = split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request("POST" if data is not None else "GET", base + path, body=data, headers=headers)
        reply = conn.getresponse()
        raw = reply.read()
        if reply.status != 200:
            raise ServerError("%s%s answered HTTP %d: %s" % (url, path, reply.status, raw[:200].decode("utf-8", "replace")))
        return json.loads(raw.decode("utf-8")) if raw else {}
    except (OSError, socket.timeout) as exc:
        raise ServerError("cannot reach the server at %s%s: %s" % (url, path, exc))
    except ValueError:
        raise ServerError("%s%s did not answer JSON" % (url, path))
    finally:
        conn.close()


def make_prompt_ids(seed, length):
    rng = random.Random(seed)
    return [rng.randint(1000, 20000) for _ in range(length)]


def make_prompt_text(seed, length):
    rng = random.Random(seed)
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(length))


def request_for(payload, model, index, seed):
    """(path, body) for request ``index``: the payload's request list (random lengths, ShareGPT
    prompts) when it has one, else the fixed --input-len/--output-len."""
    specs = payload.get("requests_spec") or []
    if specs:
        spec = specs[index % len(specs)]
        return build_request(payload["api"], model, seed, int(spec.get("input_len") or 1),
                             int(spec["output_len"]), prompt=spec.get("prompt"))
    return build_request(payload["api"], model, seed, int(payload["input_len"]), int(payload["output_len"]))


def build_request(api, model, seed, input_len, output_len, stream=True, prompt=None):
    """(path, body) for one generation of exactly output_len tokens (ignore_eos).

    ``prompt``: a dataset's text (ShareGPT); else a synthetic prompt of ``input_len`` tokens.
    """
    if api == "native":
        if prompt is not None:
            return "/generate", {
                "text": prompt,
                "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True},
                "stream": stream,
            }
        return "/generate", {
            "input_ids": make_prompt_ids(seed, input_len),
            "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True},
            "stream": stream,
        }
    common = {"model": model, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
              "stream": stream, "seed": seed}
    if stream:
        common["stream_options"] = {"include_usage": True}
    text = prompt if prompt is not None else make_prompt_text(seed, input_len)
    if api == "completions":
        common["prompt"] = text
        return "/v1/completions", common
    if api == "chat":
        common["messages"] = [{"role": "user", "content": text}]
        return "/v1/chat/completions", common
    raise ServerError("unknown api %r (native, completions, chat)" % api)


def _chunk_has_content(api, event):
    if api == "native":
        return True
    for choice in event.get("choices") or []:
        if api == "chat":
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                return True
        elif choice.get("text"):
            return True
    return False


def stream_request(url, api, path, body, timeout=600.0, stop=None):
    """Send one streaming request; return a sample with arrival times and cumulative token counts.

    ``chunks`` is a list of [seconds since send, cumulative completion tokens or None]: native
    chunks carry the server's cumulative count; OpenAI chunks do not, and get their counts from the
    final ``usage`` spread evenly (noted in the sample) since that is all the server says.
    """
    host, port, base = split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    sample = {"ok": False, "error": None, "chunks": [], "prompt_tokens": None, "completion_tokens": None}
    try:
        data = json.dumps(body).encode()
        t_send = time.perf_counter()
        conn.request("POST", base + path, body=data, headers={"Content-Type": "application/json",
                                                              "Accept": "text/event-stream"})
        reply = conn.getresponse()
        if reply.status != 200:
            raw = reply.read()
            sample["error"] = "HTTP %d: %s" % (reply.status, raw[:300].decode("utf-8", "replace"))
            return sample
        chunks = sample["chunks"]
        usage = None
        while True:
            if stop is not None and stop.is_set():
                sample["error"] = "interrupted"
                return sample
            line = reply.readline()
            if not line:
                break
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                event = json.loads(payload.decode("utf-8"))
            except ValueError:
                sample["error"] = "unparseable stream chunk: %r" % payload[:120]
                return sample
            if event.get("error") or event.get("object") == "error":
                err = event.get("error") or event
                sample["error"] = "server error mid-stream: %s" % (
                    err.get("message") if isinstance(err, dict) else err)
                return sample
            if api == "native":
                meta = event.get("meta_info") or {}
                count = meta.get("completion_tokens")
                if sample["prompt_tokens"] is None:
                    sample["prompt_tokens"] = meta.get("prompt_tokens")
                if count is not None and (not chunks or count > chunks[-1][1]):
                    chunks.append([now - t_send, int(count)])
                if count is not None:
                    sample["completion_tokens"] = int(count)
            else:
                if event.get("usage"):
                    usage = event["usage"]
                if _chunk_has_content(api, event):
                    chunks.append([now - t_send, None])
        if api != "native":
            if not usage:
                sample["error"] = "the server sent no usage; token counts unknown"
                return sample
            sample["prompt_tokens"] = usage.get("prompt_tokens")
            sample["completion_tokens"] = int(usage.get("completion_tokens") or 0)
            spread_counts(chunks, sample["completion_tokens"])
            sample["counts_from"] = "usage spread over chunks"
        sample["e2e_s"] = time.perf_counter() - t_send
        if not chunks:
            sample["error"] = ("the stream carried no token counts (meta_info.completion_tokens)"
                               if api == "native" else "the stream carried no tokens")
            return sample
        sample["ok"] = True
        return sample
    except (OSError, socket.timeout, http.client.HTTPException) as exc:
        sample["error"] = "connection to %s failed: %s" % (url, exc)
        return sample
    finally:
        conn.close()


def spread_counts(chunks, total):
    """Give chunks without counts cumulative counts that end at ``total`` (first chunk: 1 token)."""
    n = len(chunks)
    if n == 0:
        return
    if n == 1:
        chunks[0][1] = total
        return
    rest = max(0, total - 1)
    for i, chunk in enumerate(chunks):
        chunk[1] = 1 + int(round(rest * i / float(n - 1))) if i else 1


def sample_figures(sample):
    """TTFT, decode rate and per-token ITLs of one successful sample (seconds, tokens/s)."""
    chunks = sample["chunks"]
    t_first, n_first = chunks[0]
    t_last, n_last = chunks[-1]
    itls = []
    for (t0, c0), (t1, c1) in zip(chunks, chunks[1:]):
        tokens = c1 - c0
        if tokens > 0:
            itls.extend([(t1 - t0) / tokens] * tokens)
    decode_tokens = n_last - n_first
    decode_s = t_last - t_first
    return {
        "ttft_s": t_first,
        "decode_tokens": decode_tokens,
        "decode_s": decode_s,
        "tokens_per_s": (decode_tokens / decode_s) if decode_s > 0 else None,
        "itls_s": itls,
    }


# --------------------------------------------------------------------------- server & host facts

def server_snapshot(url, pid_file=None):
    info = {"url": url}
    try:
        info["server_info"] = http_json(url, "/get_server_info", timeout=10)
    except ServerError as exc:
        info["server_info_error"] = str(exc)
    try:
        info["model_info"] = http_json(url, "/get_model_info", timeout=10)
    except ServerError as exc:
        info["model_info_error"] = str(exc)
    pid = read_pid(pid_file) if pid_file else None
    if pid is None:
        pid = find_server_pid(url)
    if pid is not None:
        info["pid"] = pid
        info["process_env"] = process_env(pid)
        info["process_cmdline"] = process_cmdline(pid)
    return info


def read_pid(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def find_server_pid(url):
    """The pid of the process that runs sglang.launch_server on the URL's port, if visible."""
    try:
        _, port, _ = split_url(url)
    except ServerError:
        return None
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        words = process_cmdline(int(entry)) or []
        if "sglang.launch_server" in words and ("--port" not in words or
                                                  str(port) in words[words.index("--port") + 1:words.index("--port") + 2]):
            return int(entry)
    return None


def process_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return [w.decode("utf-8", "replace") for w in handle.read().split(b"\0") if w]
    except OSError:
        return None


def process_env(pid):
    """The server's tuning-relevant environment (only known prefixes: never secrets)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and key.startswith(ENV_PREFIXES):
            env[key] = value
    return env


def sha256_file(path):
    import hashlib
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def patched_sources(state_dir):
    """SGLang source files that a gpuops apply run changed and that still hold its version.

    Read from the host's apply journal (``<state_dir>/journal.jsonl``): a run that finished and
    was not rolled back, whose change to a ``sglang/...py`` file is still in place (same sha256).
    Entries are ``role:path`` so that a result says which gate patch it ran with.
    """
    if not state_dir:
        return []
    runs = {}
    try:
        with open(os.path.join(state_dir, "journal.jsonl")) as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                run = runs.setdefault(record.get("run_id"), {"events": [], "changes": [], "role": None})
                run["events"].append(record.get("event"))
                if record.get("event") == "started":
                    run["changes"] = record.get("changes") or []
                    run["role"] = record.get("role")
    except OSError:
        return []
    found = set()
    for run in runs.values():
        if "finished" not in run["events"] or "rolled_back" in run["events"]:
            continue
        for change in run["changes"]:
            path = change.get("path") or ""
            if "/sglang/" not in path or not path.endswith(".py"):
                continue
            if change.get("after_sha256") and sha256_file(path) == change["after_sha256"]:
                rel = path[path.rindex("/sglang/") + 1:]
                found.add("%s:%s" % (run["role"] or "apply", rel))
    return sorted(found)


PACKAGES = ("sglang", "sgl-kernel", "flashinfer-python", "torch", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
            "triton", "transformers")
_PACKAGE_PROBE = (
    "import json,sys\n"
    "try:\n import importlib.metadata as m\n"
    "except ImportError:\n print('{}'); sys.exit(0)\n"
    "out={}\n"
    "for n in sys.argv[1:]:\n"
    " try: out[n]=m.version(n)\n"
    " except Exception: pass\n"
    "print(json.dumps(out))\n"
)


def package_versions(python):
    """Versions of the serving stack as the server's python sees them (metadata only, no imports)."""
    if not python:
        return None
    try:
        done = subprocess.run([python, "-c", _PACKAGE_PROBE] + list(PACKAGES), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=30)
        return json.loads(done.stdout.decode("utf-8", "replace") or "{}") if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def host_snapshot(server_python=None):
    facts = {"hostname": socket.gethostname(), "python": sys.version.split()[0]}
    packages = package_versions(server_python)
    if packages is not None:
        facts["packages"] = packages
    try:
        facts["kernel"] = os.uname().release
    except AttributeError:
        pass
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,driver_version,pci.bus_id",
             "--format=csv,noheader"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20)
        if done.returncode == 0:
            gpus = []
            for line in done.stdout.decode("utf-8", "replace").splitlines():
                fields = [f.strip() for f in line.split(",")]
                if len(fields) >= 6:
                    gpus.append({"index": fields[0], "name": fields[1], "compute_cap": fields[2],
                                 "memory_total": fields[3], "driver_version": fields[4], "pci_bus_id": fields[5]})
            facts["gpus"] = gpus
        else:
            facts["gpus_error"] = done.stderr.decode("utf-8", "replace").strip()[-200:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        facts["gpus_error"] = str(exc)
    return facts


# --------------------------------------------------------------------------- statistics

def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def describe(values):
    """bench_serving's statistics of one latency: mean, median (also as p50), std, p90, p95, p99."""
    if not values:
        return {"mean": None, "median": None, "std": None, "p50": None, "p90": None, "p95": None, "p99": None}
    n = len(values)
    mean = sum(values) / float(n)
    std = (sum((v - mean) ** 2 for v in values) / float(n)) ** 0.5  # population std, as numpy's default
    median = percentile(values, 50)
    return {"mean": mean, "median": median, "std": std, "p50": median, "p90": percentile(values, 90),
            "p95": percentile(values, 95), "p99": percentile(values, 99)}


def request_tpot_ms(sample, figures):
    """Time per output token after the first, per request: (E2E - TTFT) / (output tokens - 1)."""
    tokens = sample.get("completion_tokens") or 0
    if tokens < 2 or sample.get("e2e_s") is None:
        return None
    return (sample["e2e_s"] - figures["ttft_s"]) * 1000.0 / (tokens - 1)


def meets_slo(sample, figures, slo):
    """Whether one completed request met every SLO given (ttft_ms, tpot_ms, e2e_ms, itl_ms: p99 of its own)."""
    checks = {
        "ttft_ms": figures["ttft_s"] * 1000.0,
        "tpot_ms": request_tpot_ms(sample, figures),
        "e2e_ms": (sample.get("e2e_s") or 0) * 1000.0,
        "itl_ms": percentile([x * 1000.0 for x in figures["itls_s"]], 99),
    }
    for key, limit in slo.items():
        value = checks.get(key)
        if value is not None and value > float(limit):
            return False
    return True


def summarize_samples(samples, duration_s=None, slo=None):
    good = [s for s in samples if s.get("ok")]
    figures = [sample_figures(s) for s in good]
    decode_tokens = sum(f["decode_tokens"] for f in figures)
    decode_s = sum(f["decode_s"] for f in figures)
    ttfts = [f["ttft_s"] * 1000.0 for f in figures]
    itls = [x * 1000.0 for f in figures for x in f["itls_s"]]
    e2e = [s["e2e_s"] * 1000.0 for s in good if s.get("e2e_s") is not None]
    tpots = [t for t in (request_tpot_ms(s, f) for s, f in zip(good, figures)) if t is not None]
    summary = {
        "requests": len(samples),
        "completed": len(good),
        "failed": len(samples) - len(good),
        "output_tokens": sum(s.get("completion_tokens") or 0 for s in good),
        "input_tokens": sum(s.get("prompt_tokens") or 0 for s in good),
        # decode rate of one stream: tokens after the first over the time after the first
        "output_tokens_per_s": (decode_tokens / decode_s) if decode_s > 0 else None,
        "ttft_ms": describe(ttfts),
        "tpot_ms": describe(tpots),
        "itl_ms": describe(itls),
        "e2e_latency_ms": describe(e2e),
    }
    if duration_s:
        summary["duration_s"] = duration_s
        summary["request_throughput"] = len(good) / duration_s
        summary["input_tokens_per_s"] = summary["input_tokens"] / duration_s
        summary["total_output_tokens_per_s"] = summary["output_tokens"] / duration_s
        summary["total_tokens_per_s"] = (summary["input_tokens"] + summary["output_tokens"]) / duration_s
    if slo:
        met = sum(1 for s, f in zip(good, figures) if meets_slo(s, f, slo))
        summary["slo"] = dict(slo)
        summary["slo_met"] = met
        summary["slo_attainment"] = (met / float(len(samples))) if samples else None
        if duration_s:
            summary["goodput_request_per_s"] = met / duration_s
    errors = [s.get("error") for s in samples if not s.get("ok")]
    if errors:
        summary["first_error"] = errors[0]
    return summary


def compact_sample(sample, index, extra=None):
    out = {"index": index, "ok": sample.get("ok"), "error": sample.get("error"),
           "prompt_tokens": sample.get("prompt_tokens"), "completion_tokens": sample.get("completion_tokens"),
           "e2e_s": sample.get("e2e_s"), "chunks": [[round(t, 6), c] for t, c in sample.get("chunks", [])]}
    if sample.get("counts_from"):
        out["counts_from"] = sample["counts_from"]
    if extra:
        out.update(extra)
    return out


# --------------------------------------------------------------------------- suites

def model_name(snapshot):
    """The name OpenAI-style requests use: the served name when set, else the model path."""
    args = (snapshot.get("server_info") or {}).get("server_args") or snapshot.get("server_info") or {}
    return (args.get("served_model_name") or (snapshot.get("model_info") or {}).get("model_path")
            or args.get("model_path") or "default")


def run_warmup(payload, model, emitter, stop):
    for i in range(int(payload.get("warmup", 2))):
        path, body = build_request(payload["api"], model, 10000 + i, min(32, int(payload["input_len"])),
                                   min(16, int(payload["output_len"])))
        sample = stream_request(payload["url"], payload["api"], path, body,
                                timeout=float(payload.get("request_timeout", 600)), stop=stop)
        if not sample["ok"]:
            raise ServerError("warm-up request failed: %s" % sample["error"])


def suite_decode(payload, model, emitter, stop):
    run_warmup(payload, model, emitter, stop)
    samples = []
    for i in range(int(payload.get("num_requests", 5))):
        if stop.is_set():
            break
        path, body = request_for(payload, model, i, int(payload.get("seed", 0)) + i)
        sample = stream_request(payload["url"], payload["api"], path, body,
                                timeout=float(payload.get("request_timeout", 600)), stop=stop)
        if sample.get("error") == "interrupted":
            break
        samples.append(sample)
        emitter.emit("sample", compact_sample(sample, i))
        if not sample["ok"] and payload.get("stop_on_error", True):
            break
    return samples


def serving_levels(payload):
    """[(concurrency cap or None, request rate or None)]: closed-loop levels, or Poisson rates."""
    rates = payload.get("request_rates")
    if rates:
        cap = payload.get("max_concurrency")
        return [(int(cap) if cap else None, float(r)) for r in rates]
    return [(int(c), None) for c in payload.get("concurrency", [1, 4, 16, 64])]


def arrival_times(count, rate, seed):
    """Seconds after the level's start at which each request is sent: a Poisson process of
    ``rate`` requests/s (exponential gaps, seeded), or all at once for an infinite rate."""
    if rate is None or rate == float("inf") or rate <= 0:
        return [0.0] * count
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def suite_serving(payload, model, emitter, stop):
    run_warmup(payload, model, emitter, stop)
    levels = serving_levels(payload)
    slo = payload.get("slo") or None
    for level_index, (concurrency, rate) in enumerate(levels):
        if stop.is_set():
            break
        count = int(payload.get("requests_per_level") or max(4, 2 * (concurrency or 8)))
        samples = []
        lock = threading.Lock()
        # closed loop: `concurrency` workers; rate mode: a send schedule, at most `concurrency` in flight
        gate = threading.Semaphore(concurrency) if concurrency else None
        schedule = arrival_times(count, rate, int(payload.get("seed", 0)) + level_index)
        emitter.emit("progress", {"level": level_index, "levels": len(levels), "concurrency": concurrency,
                                  "request_rate": rate, "requests": count})

        def one(i):
            sent = time.perf_counter() - started
            try:
                seed = int(payload.get("seed", 0)) + 1000 * level_index + i
                path, body = request_for(payload, model, i, seed)
                sample = stream_request(payload["url"], payload["api"], path, body,
                                        timeout=float(payload.get("request_timeout", 600)), stop=stop)
                if sample.get("error") == "interrupted":
                    return
                with lock:
                    samples.append(sample)
                emitter.emit("sample", compact_sample(sample, i, {"concurrency": concurrency, "request_rate": rate,
                                                                  "sent_s": round(sent, 6)}))
            finally:
                if gate is not None:
                    gate.release()

        started = time.perf_counter()
        threads = []
        for i, at in enumerate(schedule):
            delay = started + at - time.perf_counter()
            while delay > 0 and not stop.is_set():
                time.sleep(min(delay, 0.2))
                delay = started + at - time.perf_counter()
            if gate is not None:
                while not gate.acquire(timeout=0.2):
                    if stop.is_set():
                        break
            if stop.is_set():
                break
            thread = threading.Thread(target=one, args=(i,))
            thread.daemon = True
            thread.start()
            threads.append(thread)
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
        duration = time.perf_counter() - started
        summary = summarize_samples(samples, duration, slo)
        summary["concurrency"] = concurrency
        summary["request_rate"] = rate
        if rate is not None and len(schedule) > 1 and schedule[-1] > 0:
            summary["scheduled_rate"] = (len(schedule) - 1) / schedule[-1]  # what the Poisson draw gave
        summary["partial"] = stop.is_set()
        emitter.emit("level", summary)


def in_temp_dir(prefix, work):
    """Run ``work(dir)`` in a fresh temp dir that is removed afterwards (nothing left on the host)."""
    import shutil
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        return work(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def suite_tool(payload, emitter, stop):
    in_temp_dir("gpuops-bench-tool-", lambda d: _suite_tool(payload, emitter, stop, d))


def _suite_tool(payload, emitter, stop, out_dir):
    """Run SGLang's own benchmark module with the server's python; relay its JSONL lines.

    One run per argv tail in ``tool.runs`` (bench_serving: one per concurrency level); each run
    appends its result line to the output file, which is read back once per run.
    """
    tool = payload["tool"]
    for run_index, tail_args in enumerate(tool.get("runs") or [[]]):
        if stop.is_set():
            break
        out_file = os.path.join(out_dir, "result-%d.jsonl" % run_index)
        argv = [tool.get("python") or "python3", "-m", tool["module"], "--base-url", payload["url"]]
        argv += [str(a) for a in tail_args]
        argv += [tool.get("output_flag", "--output-file"), out_file]
        emitter.emit("note", {"message": "running %s %s" % (tool["module"], " ".join(argv[5:]))})
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise ServerError("cannot run %s: %s" % (argv[0], exc))
        tail = []
        try:
            for raw in iter(proc.stdout.readline, b""):
                tail.append(raw.decode("utf-8", "replace").rstrip())
                del tail[:-40]
                if stop.is_set() and proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = []
        if os.path.exists(out_file):
            with open(out_file) as handle:
                lines = [line for line in handle.read().splitlines() if line.strip()]
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                emitter.emit("note", {"message": "unparseable tool output line: %s" % line[:200]})
                continue
            if isinstance(record, dict):
                record.pop("server_info", None)  # already sent as the server record
                record["_run_index"] = run_index
            emitter.emit("tool", record)
        if (proc.returncode != 0 or not lines) and not stop.is_set():
            raise ServerError("%s exited %s: %s" % (tool["module"], proc.returncode, " | ".join(tail[-5:])))


def gpu_count():
    try:
        done = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return len([l for l in done.stdout.decode("utf-8", "replace").splitlines() if l.startswith("GPU ")]) or None


def served_hidden_size(url):
    """hidden_size from the served model's config.json (text_config for multimodal wrappers)."""
    try:
        model_path = http_json(url, "/get_model_info", timeout=5).get("model_path")
    except ServerError:
        return None, "server not reachable"
    if not model_path:
        return None, "the server named no model path"
    try:
        with open(os.path.join(model_path, "config.json")) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        return None, "cannot read %s/config.json (%s)" % (model_path, exc.__class__.__name__)
    for holder in (config, config.get("text_config") or {}, config.get("language_config") or {}):
        if isinstance(holder, dict) and isinstance(holder.get("hidden_size"), int):
            return holder["hidden_size"], "%s/config.json" % model_path
    return None, "no hidden_size in %s/config.json" % model_path


def suite_allreduce(payload, emitter, stop):
    in_temp_dir("gpuops-allreduce-", lambda d: _suite_allreduce(payload, emitter, stop, d))


def variant_timeout(spec, kind):
    """Seconds one torchrun launch may take before it counts as hung: from the sizes asked.

    Start-up (process group, NCCL communicators; FlashInfer's kernel compile for fusion) plus a
    generous allowance per size and mode; ``timeout_s`` in the payload overrides it.
    """
    if spec.get("timeout_s"):
        return float(spec["timeout_s"])
    sizes = len(spec.get("tokens") or [1])
    if kind == "fusion":
        return 600.0 + 30.0 * sizes  # first call compiles FlashInfer's kernels (minutes)
    return 90.0 + 15.0 * sizes * (2 if spec.get("cuda_graph") else 1)


def kill_group(proc, grace=5.0):
    """SIGTERM the torchrun process group, then SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        deadline = time.time() + wait
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if proc.poll() is not None:
            # torchrun is gone; its ranks may linger in the group: make sure
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            return


def _suite_allreduce(payload, emitter, stop, work_dir):
    """Run the torch.distributed worker once per NCCL variant with torchrun; relay its frames.

    Each launch has a watchdog: past its timeout the whole process group is killed, the variant
    is recorded as ``timed out after N s (hung collective)`` and the next variant runs. Records
    relayed before that are kept (they were emitted, and written to the host's record file).
    """
    spec = payload["allreduce"]
    kind = spec.get("kind") or ("fusion" if payload.get("suite") == "fusion" else "allreduce")
    script = os.path.join(work_dir, "%s_bench.py" % kind)
    with open(script, "w") as handle:
        handle.write(spec["worker_source"])
    python = spec.get("python") or "python3"
    if not spec.get("world_size"):
        found = gpu_count() if spec.get("backend") != "gloo" else None
        spec["world_size"] = found or (2 if spec.get("backend") == "gloo" else 1)
        emitter.emit("note", {"message": "world size %d (%s)" % (
            spec["world_size"], "nvidia-smi -L" if found else "default")})
    if not spec.get("hidden_size"):
        hidden, source = served_hidden_size(payload.get("url") or "")
        spec["hidden_size"] = hidden or 7168
        emitter.emit("note", {"message": "hidden size %d (%s)" % (
            spec["hidden_size"], source if hidden else "default; " + source)})
    timeout = variant_timeout(spec, kind)
    variants = spec.get("variants") or [{}]
    for variant_index, variant in enumerate(variants):
        if stop.is_set():
            break
        config = dict(spec)
        config.pop("worker_source", None)
        config["variant"] = variant
        config["run_id"] = emitter.run_id
        config_path = os.path.join(work_dir, "config-%d.json" % variant_index)
        with open(config_path, "w") as handle:
            json.dump(config, handle)
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in variant.items()})
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        argv = [python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(int(spec.get("world_size", 1))), script, config_path]
        emitter.emit("note", {"message": "variant %s (%d of %d, watchdog %.0f s)" % (
            variant or "default", variant_index + 1, len(variants), timeout)})
        emitter.emit("progress", {"variant": variant, "index": variant_index, "total": len(variants)})
        outcome = run_watched(argv, env, emitter, stop, timeout, kind)
        if outcome["timed_out"]:
            emitter.emit("error", {"variant": variant, "timed_out": True, "records": outcome["seen"],
                                   "message": "timed out after %.0f s (hung collective)" % timeout})
        elif outcome["returncode"] != 0 and not stop.is_set():
            errors = outcome["stderr"]
            interesting = [e for e in errors if "Error" in e or "error" in e] or errors
            emitter.emit("error", {"variant": variant, "message": "torchrun exited %d: %s" % (
                outcome["returncode"], (interesting[-1] if interesting else "no output"))})
        elif outcome["seen"] == 0 and not stop.is_set():
            emitter.emit("error", {"variant": variant, "message": "no measurement came back"})


def run_watched(argv, env, emitter, stop, timeout, kind):
    """One torchrun launch under a watchdog; relays its ``kind`` frames as they arrive."""
    import queue

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    errors = []
    lines = queue.Queue()

    def drain_stderr():
        for raw in iter(proc.stderr.readline, b""):
            errors.append(raw.decode("utf-8", "replace").rstrip())
            del errors[:-30]

    def drain_stdout():
        for raw in iter(proc.stdout.readline, b""):
            lines.put(raw)
        lines.put(None)

    readers = [threading.Thread(target=drain_stderr), threading.Thread(target=drain_stdout)]
    for reader in readers:
        reader.daemon = True
        reader.start()
    prefix = FRAME + " " + emitter.run_id + " " + kind + " "
    seen = 0
    timed_out = False
    deadline = time.time() + timeout
    try:
        while True:
            try:
                raw = lines.get(timeout=0.5)
            except queue.Empty:
                raw = b""
            if raw is None:
                break
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith(prefix):
                try:
                    record = json.loads(line[len(prefix):])
                except ValueError:
                    record = None
                if isinstance(record, dict):
                    seen += 1
                    emitter.emit(kind, record)
            if stop.is_set():
                kill_group(proc)
                break
            if time.time() > deadline:
                timed_out = True
                kill_group(proc)
                break
        # what was printed before the kill still counts
        while True:
            try:
                raw = lines.get(timeout=1.0)
            except queue.Empty:
                break
            if raw is None:
                break
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith(prefix):
                try:
                    emitter.emit(kind, json.loads(line[len(prefix):]))
                    seen += 1
                except ValueError:
                    pass
        if proc.poll() is None and not timed_out and not stop.is_set():
            remaining = max(1.0, deadline - time.time())
            try:
                proc.wait(remaining)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc)
    finally:
        if proc.poll() is None:
            kill_group(proc, grace=1.0)
        proc.wait()
    for reader in readers:
        reader.join(2)
    return {"returncode": proc.returncode, "timed_out": timed_out, "seen": seen, "stderr": errors}


# --------------------------------------------------------------------------- main

def run(payload, emitter):
    stop = threading.Event()
    emitter.on_broken = stop.set

    def on_signal(signum, frame):
        stop.set()

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except (ValueError, OSError):
            pass  # not the main thread (in-process tests): no signal handling
    pid_file = payload.get("pid_file")
    if pid_file:
        with open(pid_file, "w") as handle:
            handle.write("%d\n" % os.getpid())
    status = 0
    kept = emitter.keep_on_host(payload["record_file"]) if payload.get("record_file") else None
    if payload.get("progress_file"):
        emitter.track(payload["progress_file"], expected_records(payload))
    try:
        emitter.emit("start", {"pid": os.getpid(), "suite": payload["suite"], "time": time.time(),
                               "record_file": kept})
        if payload.get("host_facts", True):
            facts = host_snapshot(payload.get("server_python"))
            facts["patched_sources"] = patched_sources(payload.get("state_dir"))
            emitter.emit("host", facts)
        suite = payload["suite"]
        if suite in ("decode", "serving") or payload.get("tool"):
            snapshot = server_snapshot(payload["url"], payload.get("server_pid_file"))
            emitter.emit("server", snapshot)
            if "server_info_error" in snapshot and "model_info_error" in snapshot:
                raise ServerError(snapshot["server_info_error"])
        if payload.get("tool"):
            suite_tool(payload, emitter, stop)
        elif suite == "decode":
            suite_decode(payload, model_name(snapshot), emitter, stop)
        elif suite == "serving":
            suite_serving(payload, model_name(snapshot), emitter, stop)
        elif suite in ("allreduce", "fusion"):
            suite_allreduce(payload, emitter, stop)
        else:
            raise ServerError("unknown suite %r" % suite)
        if suite in ("decode", "serving") and not payload.get("tool"):
            # after the run: the server's accept length reflects what was just measured
            try:
                info = http_json(payload["url"], "/get_server_info", timeout=10)
                emitter.emit("server_after", {"internal_states": info.get("internal_states")})
            except ServerError:
                pass
    except ServerError as exc:
        emitter.emit("error", {"message": str(exc)})
        status = 3
    finally:
        emitter.emit("end", {"partial": stop.is_set(), "time": time.time()})
        emitter.untrack()
        if emitter.keep is not None:
            try:
                emitter.keep.close()
            except OSError:
                pass
            emitter.keep = None
        if pid_file:
            try:
                os.unlink(pid_file)
            except OSError:
                pass
        for sig, handler in previous.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError):
                pass
    return status


def load_payload():
    raw = globals().get("GPUOPS_PAYLOAD")
    if raw is None:
        if len(sys.argv) < 2:
            sys.stderr.write("usage: bench_client.py PAYLOAD.json\n")
            sys.exit(2)
        with open(sys.argv[1], "rb") as handle:
            raw = handle.read()
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    return json.loads(raw)


if __name__ == "__main__":
    _payload = load_payload()
    sys.exit(run(_payload, Emitter(_payload["run_id"])))
