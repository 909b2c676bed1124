"""The host lock: one gpuops run at a time on a host (flock on ``STATE/lock``).

Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

import errno
import fcntl
import os

from gpuops.remote.apply_common import StepFailed, now


def take_lock(state_dir):
    """flock on STATE/lock, non-blocking: a second run on this host fails at once."""
    path = os.path.join(state_dir, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise
        holder = ""
        try:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        except OSError:
            pass
        os.close(fd)
        raise StepFailed(
            "another gpuops run holds the host lock %s%s; try again when it has finished"
            % (path, " (" + holder + ")" if holder else "")
        )
    note_lock_holder(fd)
    return fd


def note_lock_holder(fd):
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("pid %d since %s" % (os.getpid(), now())).encode(), 0)
