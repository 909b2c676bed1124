"""Record SGLang's own profiler and speculative decoding on a real server (stdlib; run by run.sh).

    python3 record_profile.py OUTDIR DEADLINE_S -- NAME:EXTRA_ARGS... -- python3 -m sglang.launch_server ARGS...

For each variant NAME (its EXTRA_ARGS appended to the launch, words joined by ','; 'base' adds
none), one server is started by hand, and recorded into OUTDIR/NAME/:
- start.json: ms to the first /health 200 (or how the server died: the log's tail);
- decode.json: 5 sequential /generate of 128 new tokens at batch 1 (ignore_eos), each request's
  wall ms and the tokens it produced, tok/s per stream; /server_info and /metrics after them
  (speculative decoding's accepted length lives there, under the release's own names);
- profile-*.json: POST /start_profile answers (num_steps 8, CPU+GPU; one run by stage where the
  variant asks for it; a second start while one runs, as SGLang refuses it), the files each rank
  wrote (names, sizes), how long until they were complete; the traces copied to OUTDIR/NAME/traces/;
- server.log: the server's output.
The gpuops profile issue's real traces and the speculative tune issue's real figures come from here.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import record  # the same directory: the bounded HTTP client and the process helpers

PROFILE_ROOT = "/tmp/sglang-profile"
_copied = [0]  # bytes of traces copied so far, all variants together


def decode_run(outdir):
    rows = []
    body = {"text": "def fibonacci(n):\n    ", "sampling_params": {"max_new_tokens": 128, "temperature": 0,
                                                                    "ignore_eos": True}}
    for _ in range(6):
        started = record.now_ms()
        answer = record.http("POST", "/generate", body, timeout=120)
        wall = record.now_ms() - started
        meta = (answer.get("json") or {}).get("meta_info", {}) if isinstance(answer.get("json"), dict) else {}
        rows.append({"status": answer["status"], "wall_ms": round(wall, 1),
                     "completion_tokens": meta.get("completion_tokens"),
                     "spec_verify_ct": meta.get("spec_verify_ct"),
                     "spec_accept_length": meta.get("spec_accept_length"),
                     "e2e_latency": meta.get("e2e_latency"),
                     "meta_keys": sorted(meta)})
    measured = rows[1:]  # the first is the warm-up
    toks = [r["completion_tokens"] / (r["wall_ms"] / 1000.0) for r in measured
            if r["status"] == 200 and r["completion_tokens"]]
    result = {"requests": rows, "tok_s_per_stream": sorted(toks),
              "tok_s_median": sorted(toks)[len(toks) // 2] if toks else None}
    for path in ("/server_info", "/metrics"):
        result[path] = record.http("GET", path)
    record.write(outdir, "decode.json", result)
    print("decode", json.dumps({k: result[k] for k in ("tok_s_median",)}), flush=True)


def drive_load(stop):
    body = {"text": "import numpy as np\n", "sampling_params": {"max_new_tokens": 48, "temperature": 0,
                                                              "ignore_eos": True}}
    while not stop.is_set():
        record.http("POST", "/generate", body, timeout=60)


def trace_files(directory):
    found = []
    for base, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(base, name)
            try:
                found.append({"path": path, "bytes": os.path.getsize(path)})
            except OSError:
                pass
    return sorted(found, key=lambda f: f["path"])


def profile_run(outdir, tag, request, second_start=False):
    # one folder per variant and run: the release names its files by a profile id only, so a shared
    # folder made each variant's traces/ hold the earlier variants' files too (call 5)
    directory = os.path.join(PROFILE_ROOT, os.path.basename(outdir), tag)
    os.makedirs(directory, exist_ok=True)
    request = dict(request, output_dir=directory)
    stop = threading.Event()
    load = threading.Thread(target=drive_load, args=(stop,), daemon=True)
    result = {"request": request}
    started = record.now_ms()
    result["start"] = record.http("POST", "/start_profile", request, timeout=120)
    result["start_ms"] = round(record.now_ms() - started)
    load.start()
    if second_start:
        result["second_start"] = record.http("POST", "/start_profile", request, timeout=60)
    # The profiler stops itself after num_steps; the trace is complete when its size stops moving.
    last, steady_since = None, None
    while record.now_ms() - started < 90_000:
        files = trace_files(directory)
        sizes = [f["bytes"] for f in files]
        if files and sizes == last:
            if steady_since and record.now_ms() - steady_since > 3000:
                break
            steady_since = steady_since or record.now_ms()
        else:
            steady_since = None
        last = sizes
        time.sleep(0.5)
    result["files_ms"] = round(record.now_ms() - started)
    result["stop"] = record.http("POST", "/stop_profile", {}, timeout=60)
    stop.set()
    load.join(timeout=70)
    result["files"] = trace_files(directory)
    keep = os.path.join(outdir, "traces", tag)
    os.makedirs(keep, exist_ok=True)
    for f in result["files"]:  # what comes back from the device is one archive of at most 16 MiB
        if f["bytes"] <= 4_000_000 and _copied[0] + f["bytes"] <= 10_000_000:
            shutil.copy(f["path"], keep)
            _copied[0] += f["bytes"]
        else:
            f["not_copied"] = "over the archive's budget"
    record.write(outdir, f"profile-{tag}.json", result)
    print("profile", tag, json.dumps({"files": result["files"], "start": result["start"].get("status")}), flush=True)


def run_variant(outdir, name, extra, launch, deadline):
    os.makedirs(outdir, exist_ok=True)
    log = open(os.path.join(outdir, "server.log"), "wb")
    argv = launch + extra
    started = record.now_ms()
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start = {"argv": argv, "health_ms": None}
    while record.now_ms() - started < 300_000 and time.monotonic() < deadline:
        if server.poll() is not None:
            start["died_rc"] = server.returncode
            break
        if record.port_open() and record.http("GET", "/health", timeout=5)["status"] == 200:
            start["health_ms"] = round(record.now_ms() - started)
            break
        time.sleep(0.5)
    record.write(outdir, "start.json", start)
    print("start", name, json.dumps(start)[-300:], flush=True)
    try:
        if start["health_ms"] is not None:
            decode_run(outdir)
            if time.monotonic() < deadline - 60:
                profile_run(outdir, "steps8", {"num_steps": 8, "activities": ["CPU", "GPU"]},
                            second_start=(name == "base"))
            if name == "base" and time.monotonic() < deadline - 60:
                profile_run(outdir, "bystage", {"num_steps": 6, "activities": ["GPU"], "profile_by_stage": True})
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.wait(timeout=10)
        for pid in [row["pid"] for row in record.proc_tree(server.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
        time.sleep(3)  # the GPU's memory back before the next server


def main():
    outdir, budget = sys.argv[1], float(sys.argv[2])
    deadline = time.monotonic() + budget
    first = sys.argv.index("--")
    second = sys.argv.index("--", first + 1)
    variants, launch = sys.argv[first + 1:second], sys.argv[second + 1:]
    for spec in variants:
        name, _, extra = spec.partition(":")
        if time.monotonic() > deadline - 90:
            print("skipped", name, "(deadline)", flush=True)
            continue
        run_variant(os.path.join(outdir, name), name, [w for w in extra.split(",") if w], launch, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
