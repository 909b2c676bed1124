"""Files on the host as the apply transaction writes them: whole lines only, atomic, fsynced.

Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

import json
import os
import tempfile


def read_complete_lines(path, offset):
    """The whole lines appended to ``path`` since ``offset``, and the offset after them: a line still
    being written is left for the next read, so a reader never acts on half a JSON message."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        chunk = b""
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return complete, offset + len(complete)


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data, mode=None, uid=None, gid=None):
    """Temp file in the same directory + fsync + rename: readers see the old or the new file.

    Mode and owner are those given, else the current file's, so a rewrite never loosens them.
    """
    directory = os.path.dirname(path) or "."
    try:
        current = os.stat(path)
    except FileNotFoundError:
        current = None
    if mode is None:
        mode = (current.st_mode & 0o7777) if current else 0o644
    if uid is None and current is not None:
        uid, gid = current.st_uid, current.st_gid
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".gpuops-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if uid is not None and hasattr(os, "fchown"):
                try:
                    os.fchown(handle.fileno(), uid, gid if gid is not None else -1)
                except PermissionError:
                    pass  # not root: the file stays ours, as it was when we could write it
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def append_line(path, record):
    """One JSON line, fsynced. A torn last line (a writer that died mid-line) is ended first, so
    this record never glues onto it."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def under(path, root):
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")
