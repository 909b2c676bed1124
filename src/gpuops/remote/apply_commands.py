"""Commands the apply transaction runs on the host, polled under the lease (plain ones: ``service_base.run_command``).

One polled runner for all of them: the compile check, the gate re-audit, and every ``docker``
command of a derived image's build (``container_image.docker``). Stdlib only, Python 3.8+; bundled
with ``apply_helper``.
"""

import os
import signal
import subprocess
import tempfile
import time

from gpuops.remote.apply_common import POLL_S, StepFailed


def run_watched(argv, work_dir, check, timeout, too_long, stdin_data=None):
    """``argv`` with its input and output in files in ``work_dir`` (no pipe to fill while we poll):
    (exit status, stdout bytes, stderr bytes). ``check()`` is called every POLL_S while it runs;
    whatever it raises (the lease lapsed) ends the command first, its whole process group killed; past
    ``timeout`` seconds, ``too_long()`` (the caller's error) is raised the same way. A missing program
    raises the OSError of ``Popen``."""
    fds, paths = [], []
    try:
        for prefix in ("in-", "out-", "err-"):
            fd, path = tempfile.mkstemp(prefix="cmd-" + prefix, dir=work_dir)
            fds.append(fd)
            paths.append(path)
        if stdin_data is not None:
            os.write(fds[0], stdin_data)
            os.lseek(fds[0], 0, os.SEEK_SET)
        proc = subprocess.Popen(argv, stdin=fds[0], stdout=fds[1], stderr=fds[2], start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                check()
                if time.monotonic() > deadline:
                    raise too_long()
                time.sleep(POLL_S)
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            raise
        return proc.returncode, _read_all(fds[1]), _read_all(fds[2])
    finally:
        for fd in fds:
            os.close(fd)
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass


def _read_all(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def run_polled(argv, lease, where, work_dir, timeout=600):
    """A command of the run: LeaseLapsed if the lease lapses, StepFailed past ``timeout``."""
    return run_watched(argv, work_dir, lambda: lease.check(where), timeout,
                       lambda: StepFailed("%s took longer than %ds" % (where, timeout)))
