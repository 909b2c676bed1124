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


# -- directories a run creates (a managed file whose parent did not exist) and takes away again


def missing_dirs(path):
    """The directories above ``path`` that do not exist, deepest last: what writing it creates."""
    missing = []
    parent = os.path.dirname(os.path.normpath(path))
    while parent and not os.path.lexists(parent):
        missing.append(parent)
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    return list(reversed(missing))


def remove_created_dirs(dirs):
    """``rmdir`` each of ``dirs`` (a run recorded that it created them), deepest first, only while
    empty: a directory someone put a file in since (or replaced by a link) is kept, and so is every
    directory above it. Never a directory a run did not record. Returns (removed, kept)."""
    removed, kept = [], []
    for path in reversed(list(dirs or [])):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError:  # not empty, or no longer a directory: not ours to take away
            kept.append(path)
            continue
        fsync_dir(os.path.dirname(path) or "/")
        removed.append(path)
    return removed, kept


def dir_records(dirs):
    """Mode and owner of each existing directory of ``dirs`` (deepest last): enough to make it again."""
    records = []
    for path in dirs or []:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            records.append({"path": path, "mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid})
    return records


def recreate_dirs(records):
    """Make again, shallowest first, each directory of ``records`` (``dir_records``) that is gone,
    with its mode and owner: what a run removed when it deleted a file is back before the file."""
    for record in records or []:
        path = record["path"]
        if os.path.lexists(path):
            continue
        os.mkdir(path, 0o700)
        os.chmod(path, record["mode"])  # exact, whatever the umask
        try:
            os.chown(path, record.get("uid", -1), record.get("gid", -1))
        except (PermissionError, TypeError):
            pass  # not root: the directory stays ours, as it was when we could remove it
        fsync_dir(os.path.dirname(path) or "/")
