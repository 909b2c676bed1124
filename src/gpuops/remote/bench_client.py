"""Benchmark client that runs ON the host, next to the SGLang server (stdlib only, Python 3.8+).

Shipped on stdin by ``gpuops bench`` with a JSON payload (built by ``gpuops.bench.options``), bundled
with the host modules it imports (``bench_frames``, ``bench_http``, ``bench_snapshot``,
``bench_stats``, one module per suite, ``bench_torchrun``); it talks to the server over loopback so
the network between the operator and the host is never measured.

Output is framed, one line per record, so that a run cut short (Ctrl-C on the operator's side sends
SIGINT to this process through its pid file) still leaves every finished measurement parseable:

    GPUOPS-BENCH <run_id> <kind> <json>

kinds: ``start``, ``server`` (its /server_info and /model_info, or their older aliases, and /metrics), ``host`` (a light facts
snapshot), ``sample`` (one measured request), ``level`` (a serving concurrency level finished),
``allreduce`` (one all-reduce measurement), ``fusion`` (one fused-vs-unfused measurement),
``profile`` (one rank's trace summarised), ``trace_file`` (a raw trace, ``--fetch-traces``),
``progress`` (which level or variant starts), ``tool`` (a line of sglang.bench_* JSONL output),
``note``, ``error``, ``end`` (with ``"partial": true`` when interrupted).

Measurement rules: warm-up requests are not counted; token counts come from the server's own
``meta_info``/``usage``; with speculative decoding a chunk may carry several tokens, so inter-token
latency is the chunk gap divided by the tokens it carried, once per token.
"""

import json
import os
import signal
import sys
import threading
import time

from gpuops.remote import bench_collectives, bench_decode, bench_profile, bench_serving, bench_tool
from gpuops.remote.bench_frames import Emitter
from gpuops.remote.bench_http import ServerError
from gpuops.remote.bench_snapshot import (host_snapshot, patched_sources, server_client, server_pid,
                                          server_python_env, server_snapshot)

# The suites this client runs, by the payload's ``suite``. Each module provides NEEDS_SERVER,
# SERVER_AFTER, expected_records(payload) and run_suite(payload, snapshot, emitter, stop).
# ``--tool sglang`` (a payload with ``tool``) runs SGLang's own benchmark whatever the suite.
SUITES = {
    "decode": bench_decode,
    "serving": bench_serving,
    "allreduce": bench_collectives,
    "fusion": bench_collectives,
    "profile": bench_profile,
}


def suite_module(payload):
    """The module that runs this payload's suite (None for an unknown suite)."""
    if payload.get("tool"):
        return bench_tool
    return SUITES.get(payload.get("suite"))


def expected_records(payload):
    """How many sample/measurement frames a run sends when it completes (the progress total)."""
    module = suite_module(payload)
    return module.expected_records(payload) if module is not None else None


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
        # the server's python runs in the server's environment (its PYTHONPATH), or it records
        # another stack than the one the server imports
        pid = server_pid(payload["url"], payload.get("server_pid_file"))
        env = server_python_env(pid, payload.get("server_pythonpath"))
        # SGLang's own benchmark and torchrun's workers import the server's packages: the same env
        payload = dict(payload, server_env=env)
        if payload.get("host_facts", True):
            facts = host_snapshot(payload.get("server_python"), env)
            facts["patched_sources"] = patched_sources(payload.get("state_dir"))
            emitter.emit("host", facts)
        suite = payload["suite"]
        module = suite_module(payload)
        if module is None:
            raise ServerError("unknown suite %r" % suite)
        snapshot = None
        if module.NEEDS_SERVER:
            snapshot = server_snapshot(payload["url"], pid, payload.get("server_python"), env)
            emitter.emit("server", snapshot)
            if "server_info_error" in snapshot and "model_info_error" in snapshot:
                raise ServerError(snapshot["server_info_error"])
        module.run_suite(payload, snapshot, emitter, stop)
        if module.SERVER_AFTER:
            # after the run: the server's accept length reflects what was just measured
            # and /metrics after minus before is what the run made the server do
            client = server_client(payload["url"])
            after = {}
            try:
                after["internal_states"] = client.server_info(timeout=10).get("internal_states")
            except ServerError:
                pass
            if (snapshot or {}).get("metrics_exposed"):
                try:
                    after["metrics"] = client.metrics(timeout=10)
                except ServerError as exc:
                    after["metrics_error"] = str(exc)
            if after:
                emitter.emit("server_after", after)
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
