"""The profile suite, on the host: SGLang's own profiler for a few steps under a small load of
ours, every rank's trace read here (``profile_summary``), the summary sent home, nothing left.

What SGLang serves (read from 0.5.8's and 0.5.16's source): ``POST /start_profile`` takes a
``ProfileReq`` (``output_dir``, ``num_steps``, ``activities``, ``profile_by_stage``, and from 0.5.16
``profile_id``) and answers 200 "Start profiling."; with ``num_steps`` the profiler stops by itself
and each TP rank writes ``[<prefix>-]<profile_id>-TP-<rank>[-DP-..][-<STAGE>].trace.json.gz`` into
``output_dir`` (``-EXTEND`` then ``-DECODE`` with ``profile_by_stage``); a start while one runs
fails in the scheduler ("Profiling is already in progress"), which the HTTP route answers as a
500, as it answers ``/stop_profile`` once the profiler stopped by itself (recorded on the real
0.5.16: tests/fixtures/real/h200-x1/sglang-0.5.16/profile.json).

The profile directory is made here (``tempfile``), given to the server and removed at the end,
whatever happened; the load stops with it. Frames: ``profile`` (one per trace: its summary or why
it was not read), ``trace_file`` (``--fetch-traces``: the file, base64, bounded), ``note``.

Stdlib only, Python 3.8+ (bundled into ``bench_client``).
"""

import base64
import os
import shutil
import tempfile
import threading
import time

from gpuops.remote import profile_summary, trace_stream
from gpuops.remote.bench_http import ServerError, prompt_vocab, request_for, stream_request
from gpuops.remote.bench_snapshot import model_name, server_client
from gpuops.remote.scan_read import NotRead, read_regular

NEEDS_SERVER = True
SERVER_AFTER = False

START_ROUTE = "/start_profile"
STOP_ROUTE = "/stop_profile"
STAGES = ("decode", "verify", "extend", "all")
WAIT_S = 120.0          # from the start to every rank's trace complete (a real trace's export takes seconds)
STEADY_S = 2.0          # a trace is complete once its size has not moved for this long
FETCH_BYTES_MAX = 32 << 20  # --fetch-traces: what comes home in all (base64 inside the exec's 64 MiB)
POLL_S = 0.5


def expected_records(payload):
    return 1


def _tp_size(snapshot):
    info = (snapshot or {}).get("server_info") or {}
    args = info.get("server_args") if isinstance(info.get("server_args"), dict) else info
    value = args.get("tp_size") if isinstance(args, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1024 else 1


def traces_in(directory):
    """(name, size) of each trace file in ``directory`` (a server writes nothing else there)."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in sorted(names):
        if ".trace.json" not in name:
            continue
        try:
            found.append((name, os.lstat(os.path.join(directory, name)).st_size))
        except OSError:
            pass
    return found


def wanted_stage(stage):
    """The file suffix a stage's passes are written under with ``profile_by_stage``."""
    return "EXTEND" if stage == "extend" else "DECODE"


def _complete(found, ranks, suffix):
    """Whether every rank's trace of the wanted stage is there (a release that names no stage: any)."""
    staged = [n for n, _ in found if profile_summary.file_stage(n) == suffix]
    unstaged = [n for n, _ in found if profile_summary.file_stage(n) is None]
    return len(staged) >= ranks or len(unstaged) >= ranks


def wait_for_traces(directory, ranks, suffix, deadline, stop):
    """The trace files once every rank's is written and none has grown for ``STEADY_S``; what is
    there when ``deadline`` (monotonic) passes or ``stop`` is set."""
    last, steady_since = None, None
    while time.monotonic() < deadline and not stop.is_set():
        found = traces_in(directory)
        if found and found == last and _complete(found, ranks, suffix):
            if steady_since is not None and time.monotonic() - steady_since >= STEADY_S:
                return found
            steady_since = steady_since or time.monotonic()
        else:
            steady_since = None
        last = found
        time.sleep(POLL_S)
    return traces_in(directory)


def _drive(payload, model, stop, vocab, failures):
    """Decode-shaped requests one at a time (batch 1, the field's case) until ``stop``; the first
    failure's reason is kept in ``failures`` (a list) for the error a profile without passes gets."""
    index = 0
    while not stop.is_set():
        try:
            path, body = request_for(payload, model, index, int(payload.get("seed", 0)) + index, vocab)
            sample = stream_request(payload["url"], payload["api"], path, body,
                                    timeout=float(payload.get("request_timeout", 600)), stop=stop)
        except Exception as exc:  # the load must say why it stopped, not die unseen in its thread
            sample = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
        index += 1
        if not sample.get("ok") and not stop.is_set():
            if not failures:
                failures.append(str(sample.get("error")))
            stop.wait(1.0)  # a refused request is not retried in a tight loop


def start_profile(client, directory, steps, profile_id):
    """Ask the server to profile ``steps`` steps by stage into ``directory``; ServerError with the
    one line the operator needs when it does not."""
    # CPU activity for the step spans and the runtime calls that tie kernels to them; no Python
    # stacks or shapes (SGLang's default is with stacks: a larger trace for nothing read here)
    body = {"output_dir": directory, "num_steps": steps, "activities": ["CPU", "GPU"], "profile_by_stage": True,
            "with_stack": False, "record_shapes": False, "profile_id": profile_id}
    if client.routes is not None and START_ROUTE not in client.routes:
        raise ServerError("this SGLang release serves no %s: it has no profiler to start" % START_ROUTE)
    status, raw, _ = client.request("POST", START_ROUTE, body, timeout=60)
    said = client.hide(raw[:200].decode("utf-8", "replace")).strip()
    if status in (404, 405):
        raise ServerError("the server answers %s with HTTP %d: this release has no profiler route" % (START_ROUTE, status))
    if status in (401, 403):
        raise ServerError("the server refused %s (HTTP %d): it was launched with an admin key (--admin-api-key) "
                          "or without permission for its profiler" % (START_ROUTE, status))
    if status != 200:
        raise ServerError("the server refused to start its profiler (HTTP %d: %s): a profile already running "
                          "there (SGLang refuses a second start), or its profiler failed" % (status, said or "-"))


def run_suite(payload, snapshot, emitter, stop):
    client = server_client(payload["url"])
    steps = max(1, min(int(payload.get("profile_steps", 5)), 100))
    stage = payload.get("profile_stage", "decode")
    ranks = _tp_size(snapshot)
    directory = tempfile.mkdtemp(prefix="gpuops-profile-")
    load_stop = threading.Event()
    load = None
    try:
        _open_to_server(directory, snapshot)
        start_profile(client, directory, steps, "gpuops-%s" % payload.get("run_id", "profile"))
        emitter.emit("progress", {"stage": "profiling %d steps" % steps})
        failures = []
        load = threading.Thread(target=_drive, args=(payload, model_name(snapshot), load_stop,
                                                     prompt_vocab(snapshot, emitter), failures), name="profile-load")
        load.daemon = True
        load.start()
        wait_s = float(payload.get("profile_wait_s", WAIT_S))
        deadline = time.monotonic() + wait_s
        suffix = wanted_stage(stage)
        found = wait_for_traces(directory, ranks, suffix, deadline, stop)
        if not _complete(found, ranks, suffix) and not stop.is_set():
            # the profiler did not stop by itself (too few steps ran?): ask it to, as an operator would
            try:
                client.request("POST", STOP_ROUTE, {}, timeout=60)
            except ServerError:
                pass
            found = wait_for_traces(directory, ranks, suffix, time.monotonic() + min(30.0, wait_s), stop)
        load_stop.set()
        if not found:
            raise ServerError("the server wrote no trace in %.0f s (its profiler started; %s)" % (
                wait_s,
                "the load's requests failed: %s" % failures[0] if failures else "its log says why"))
        if failures:
            emitter.emit("note", {"message": "a request of the profile's load failed: %s" % failures[0]})
        _summaries(payload, directory, found, steps, emitter)
    finally:
        load_stop.set()
        if load is not None:
            load.join(30)
        shutil.rmtree(directory, ignore_errors=True)
        if os.path.exists(directory):
            emitter.emit("note", {"message": "the profile directory %s could not be removed" % directory})


def _summaries(payload, directory, found, steps, emitter):
    fetched = 0
    for name, size in found:
        path = os.path.join(directory, name)
        record = {"file": profile_summary.clean(name), "bytes": size}
        try:
            record["trace"] = profile_summary.summarize_trace(path, steps)
        except trace_stream.TraceError as exc:
            record["error"] = "%s %s" % (profile_summary.clean(name), exc)
        emitter.emit("profile", record)
        if payload.get("fetch_traces") and size is not None:
            if fetched + size > FETCH_BYTES_MAX:
                emitter.emit("note", {"message": "%s not fetched: the traces brought home are limited to %d MiB"
                                      % (profile_summary.clean(name), FETCH_BYTES_MAX >> 20)})
                continue
            try:
                data = read_regular(path, FETCH_BYTES_MAX - fetched)
            except NotRead as exc:
                emitter.emit("note", {"message": "%s not fetched: %s" % (profile_summary.clean(name), exc)})
                continue
            fetched += len(data)
            emitter.emit("trace_file", {"file": profile_summary.clean(name), "bytes": len(data),
                                        "base64": base64.b64encode(data).decode("ascii")})


def _open_to_server(directory, snapshot):
    """The server may run as another user than this client: then it may write (not list) here."""
    pid = (snapshot or {}).get("pid")
    try:
        owner = os.stat("/proc/%d" % int(pid)).st_uid if pid else os.getuid()
    except (OSError, ValueError, TypeError):
        owner = os.getuid()
    if owner != os.getuid():
        os.chmod(directory, 0o733)
