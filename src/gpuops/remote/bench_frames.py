"""Framed output of the bench client on the host: one line per record, ``GPUOPS-BENCH <run_id> <kind>
<json>``, written to stdout, to the host's own copy of the frames and to a small progress file.

Every record passes the secrets policy (``secret_mask.mask_reported``, the one home uses) before it
is written anywhere: the server's command line and environment, an error quoting them, a tool's
chatter. Each secret found is remembered, so a later frame that quotes it is masked too; home masks
the whole run again across all its frames (``bench/frames.masked_run``).

Stdlib only, Python 3.8+ (bundled into ``bench_client`` by ``gpuops.shipping.bundle``).
"""

import json
import os
import sys
import threading
import time

from gpuops.remote.secret_mask import mask_reported, reported_secrets
from gpuops.remote.sglang_server import known_keys


FRAME = "GPUOPS-BENCH"

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
        self.secrets = set()  # every secret a frame carried so far: masked in each later frame too

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

    def masked(self, record):
        """``record`` as it may leave this process: every secret in it, or in an earlier frame, or a
        server's key this client asked with, masked."""
        self.secrets.update(reported_secrets(record))
        self.secrets.update(known_keys())
        return mask_reported(record, self.secrets)

    def emit(self, kind, record):
        with self.lock:
            record = self.masked(record)
            line = "%s %s %s %s\n" % (FRAME, self.run_id, kind, json.dumps(record, separators=(",", ":")))
            if self.progress is not None:
                if kind in ("sample", "allreduce", "fusion", "profile"):
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
