"""One torchrun launch under a watchdog, on the host: its frames relayed as they arrive, the whole
process group killed when it outlives its timeout (a hung collective) or the run is stopped.

Stdlib only, Python 3.8+ (bundled into ``bench_client``).
"""

import json
import os
import signal
import subprocess
import threading
import time

from gpuops.remote.bench_frames import FRAME


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
    kernels = max(1, len(spec.get("kernels") or [1]))  # measured one after the other in one launch
    return 90.0 * kernels + 15.0 * sizes * kernels * (2 if spec.get("cuda_graph") else 1)


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
