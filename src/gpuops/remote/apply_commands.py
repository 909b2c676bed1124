"""Commands the apply transaction runs on the host, polled under the lease (plain ones: ``service_base.run_command``).

Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

import os
import signal
import subprocess
import tempfile
import time

from gpuops.remote.apply_common import POLL_S, LeaseLapsed, StepFailed


def run_polled(argv, lease, where, work_dir, timeout=600):
    """A subprocess whose output goes to files (no pipe to fill), killed if the lease lapses."""
    out_fd, out_path = tempfile.mkstemp(prefix="out-", dir=work_dir)
    err_fd, err_path = tempfile.mkstemp(prefix="err-", dir=work_dir)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=err_fd, start_new_session=True)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            why = lease.lapsed()
            if why or time.monotonic() > deadline:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                if why:
                    raise LeaseLapsed("%s (%s); the host was rolled back" % (why, where))
                raise StepFailed("%s took longer than %ds" % (where, timeout))
            time.sleep(POLL_S)
        with open(out_path, "rb") as handle:
            stdout = handle.read()
        with open(err_path, "rb") as handle:
            stderr = handle.read()
        return proc.returncode, stdout, stderr
    finally:
        os.close(out_fd)
        os.close(err_fd)
        for path in (out_path, err_path):
            try:
                os.unlink(path)
            except OSError:
                pass
