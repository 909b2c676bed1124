"""Who listens on a TCP port, from /proc: the check that the server answering is the one started.

Stdlib only, Python 3.8+ (a host module, bundled with the helpers that import it).
"""

import os

from gpuops.remote.sglang_argv import flag_value


def listening_inodes(port):
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6), from /proc/net/tcp{,6}."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except OSError:
            continue
    return inodes


def port_owners(port, pids):
    """Those of ``pids`` holding a socket that listens on ``port``."""
    inodes = listening_inodes(port)
    owners = []
    for pid in pids:
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.append(pid)
                break
    return owners


def process_tree(pid):
    """``pid`` and every process below it (from /proc/PID/task/*/children)."""
    seen, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.append(current)
        try:
            tasks = os.listdir("/proc/%d/task" % current)
        except OSError:
            continue
        for task in tasks:
            try:
                with open("/proc/%d/task/%s/children" % (current, task)) as handle:
                    todo.extend(int(p) for p in handle.read().split())
            except (OSError, ValueError):
                continue
    return seen


def port_flag(argv):
    """The value of ``--port N`` / ``--port=N`` in a launch's argv (a list of words), or None."""
    value = flag_value(argv, "--port")
    return int(value) if value is not None and value.isdigit() else None
