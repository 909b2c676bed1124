"""What the service-manager backends share (stdlib only, Python 3.8+): their failure and how they run
a manager's command (``systemctl``, ``docker``) without ever hanging or raising for a missing binary."""

import subprocess


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
