"""What the service-manager backends share (stdlib only, Python 3.8+): their failure and how they run
a manager's command (``systemctl``, ``docker``) without ever hanging or raising for a missing binary."""

import subprocess

# The server's timing, the same for every manager (process, systemd, docker), measured on a real
# SGLang 0.5.16 server on an H200 with a 45 M-parameter model (issue 36): a start took 63-65 s warm and
# 145-171 s cold (Python imports ~50 s, CUDA-graph capture up to 85 s); /health answered after
# >= 1.03 s (0.5.16 runs a 1-token generation, then sleeps 1 s); SIGTERM drained ~5 s and every
# process was gone at 8.2 s. The lab's simulated servers are faster: its inventories set their own.
#
# How long a restarted server may take to be healthy: that start plus the weights' load, which for a
# large MoE model (hundreds of GB read and sharded over 8 GPUs) takes 10-20 minutes.
DEFAULT_HEALTH_TIMEOUT_S = 1200
# One /health question: ~1 s on an idle server, more while its generation waits behind a busy batch.
HEALTH_PROBE_TIMEOUT_S = 10
# SIGTERM to SIGKILL: the 8 s drain, with room for a loaded server to end its requests in flight.
DEFAULT_STOP_GRACE_S = 30


class ServiceFailed(Exception):
    """The service manager did not do what was asked; ``log_tail``: the service's own log since."""

    def __init__(self, message, log_tail=None):
        Exception.__init__(self, message)
        self.log_tail = log_tail


def run_command(argv, timeout):
    """Run ``argv``; a missing binary is exit 127 and a timeout exit 124, as a shell would report them."""
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout)
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", "%s timed out after %ds" % (argv[0], timeout))
