#!/usr/bin/env python3
"""Run an SGLang server as a plain detached process: start, stop, restart, status.

Stdlib only, Python 3.8+, a host module: the apply helper imports it (bundled with it by
``remote/bundle.py``, like every host module) for the ``process`` service manager, the lab imports
it, and it runs on stdin (``shipping.python_stdin``, bundled with ``sglang_argv``, whose
``is_server_argv`` is the one rule for "this pid is the server"). It works on a host's state directory:

    sglang-launch.sh   the launch script (``exec <python> -m sglang.launch_server ...``), given
    sglang.pid         written here, atomically (temp file + rename)
    sglang.log         the server's stdout+stderr, appended, one marker line per start

    python3 -m gpuops.remote.process_manager start|stop|restart|status --state-dir D [--port P]
                               [--grace S] [--health-timeout S]

Every action prints one JSON object: ``{"running", "pid", "healthy", ...}``; ``healthy`` is null
unless ``--port`` is given (then ``GET http://127.0.0.1:P/health`` must answer 200). Exit status:
0 when the action did what was asked, 1 when it did not (a server that died during start-up or
never became healthy; the log's last lines come back in ``log_tail``).

When shipped on stdin by gpuops' helper runner (``gpuops.shipping.python_command``), the runner puts
the JSON payload in ``GPUOPS_PAYLOAD``: ``{"action": ..., "state_dir": ..., "port": ...,
"grace": ..., "health_timeout": ...}`` takes the place of the command line.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from gpuops.remote.service_base import DEFAULT_HEALTH_TIMEOUT_S, DEFAULT_STOP_GRACE_S, HEALTH_PROBE_TIMEOUT_S
from gpuops.remote.sglang_argv import is_server_argv

PID_FILE = "sglang.pid"
LOG_FILE = "sglang.log"
LAUNCH_SCRIPT = "sglang-launch.sh"
_POLL_S = 0.05
_LOG_TAIL_LINES = 20


def start(state_dir, port=None, health_timeout=DEFAULT_HEALTH_TIMEOUT_S, env=None):
    """Start the server detached unless it already runs; with ``port``, wait until healthy.

    ``env`` replaces the environment the server inherits (default: this process's).
    """
    state_dir = os.path.abspath(state_dir)
    current = status(state_dir, port)
    if current["running"]:
        current["started"] = False
        current["ok"] = True
        return current
    launch = os.path.join(state_dir, LAUNCH_SCRIPT)
    if not os.path.isfile(launch):
        return _result(False, None, None, ok=False, started=False, error="%s: no such file" % launch)
    log_path = os.path.join(state_dir, LOG_FILE)
    with open(log_path, "ab") as log:
        marker = "=== gpuops process_manager: start %s ===\n" % time.strftime("%Y-%m-%dT%H:%M:%S%z")
        log.write(marker.encode())
        log.flush()
        # A new session: the server outlives the SSH session that started it and gets no SIGHUP;
        # being its process-group leader lets stop() signal everything it spawned at once.
        child = subprocess.Popen(
            ["/bin/sh", launch],
            cwd=state_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    _write_pid_file(state_dir, child.pid)
    if port is not None and not health_timeout:
        # The caller waits for health itself (the lab launches many servers, then awaits them).
        return _result(True, child.pid, None, ok=True, started=True)
    if port is None:
        time.sleep(_POLL_S)  # lets a launch script that fails at once show it
        up = alive(child.pid)
        return _result(up, child.pid, None, ok=up, started=True, log=log_path)
    deadline = time.monotonic() + health_timeout
    while time.monotonic() < deadline:
        if not alive(child.pid):
            return _result(False, child.pid, False, ok=False, started=True, log=log_path,
                           error="the server exited during start-up")
        if _healthy(port):
            return _result(True, child.pid, True, ok=True, started=True)
        time.sleep(_POLL_S * 2)
    return _result(True, child.pid, False, ok=False, started=True, log=log_path,
                   error="not healthy after %.0f s" % health_timeout)


def stop(state_dir, grace=DEFAULT_STOP_GRACE_S):
    """SIGTERM the server's process group, SIGKILL it after ``grace`` seconds; remove the pid file."""
    state_dir = os.path.abspath(state_dir)
    pid = _read_pid(state_dir)
    if pid is None or not _is_server(pid):
        _remove_pid_file(state_dir)
        return _result(False, pid, None, ok=True, stopped=False)
    signalled = "SIGTERM"
    _signal_group(pid, signal.SIGTERM)
    if not _wait_gone(pid, grace):
        signalled = "SIGKILL"
        _signal_group(pid, signal.SIGKILL)
        _wait_gone(pid, 5.0)
    gone = not alive(pid)
    if gone:
        _remove_pid_file(state_dir)
    return _result(not gone, pid, None, ok=gone, stopped=gone, signal=signalled)


def restart(state_dir, port=None, grace=DEFAULT_STOP_GRACE_S, health_timeout=DEFAULT_HEALTH_TIMEOUT_S, env=None):
    stopped = stop(state_dir, grace)
    if not stopped["ok"]:
        return stopped
    return start(state_dir, port, health_timeout, env)


def status(state_dir, port=None):
    """``running``: the pid in the pid file is alive and still a server (not a reused pid)."""
    pid = _read_pid(os.path.abspath(state_dir))
    running = pid is not None and _is_server(pid)
    healthy = None if port is None else (running and _healthy(port))
    return _result(running, pid if running else None, healthy, ok=True)


def port_owners(port):
    """Who listens on TCP ``port`` (IPv4 or IPv6): ``[{"pid", "uid", "cmdline"}]``.

    The socket is found in /proc/net/tcp{,6} (state 0A, LISTEN) and its inode matched against
    /proc/PID/fd; ``pid`` is None when the holder's fds are not readable by us (another user)."""
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, "r") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) != int(port):
                    continue
            except ValueError:
                continue
            if fields[9] != "0":
                inodes[fields[9]] = int(fields[7])
    if not inodes:
        return []
    holders = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir("/proc/%s/fd" % name)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%s/fd/%s" % (name, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                holders.setdefault(target[8:-1], int(name))
    out = []
    for inode, uid in sorted(inodes.items()):
        pid = holders.get(inode)
        cmdline = " ".join(_cmdline(pid)) if pid else ""
        out.append({"pid": pid, "uid": uid, "cmdline": cmdline})
    return out


def describe_owners(owners):
    """'pid 123 (python -m ...)' for each holder, for a message."""
    parts = []
    for owner in owners:
        if owner["pid"] is None:
            parts.append("a process of uid %d that gpuops cannot see" % owner["uid"])
        else:
            parts.append("pid %d (%s)" % (owner["pid"], owner["cmdline"][:160] or "?"))
    return ", ".join(parts)


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            data = handle.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def owns_port(pid, port):
    """Whether ``pid``, or a process it started, holds the listening socket of ``port``."""
    for owner in port_owners(port):
        current, hops = owner["pid"], 0
        while current and current > 1 and hops < 64:
            if current == pid:
                return True
            current, hops = _parent(current), hops + 1
    return False


def _result(running, pid, healthy, **extra):
    out = {"running": running, "pid": pid, "healthy": healthy}
    log = extra.pop("log", None)
    if log is not None and not extra.get("ok", True):
        out["log_tail"] = log_tail(log)
    out.update(extra)
    return out


def _write_pid_file(state_dir, pid):
    path = os.path.join(state_dir, PID_FILE)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as handle:
        handle.write("%d\n" % pid)
    os.replace(tmp, path)


def _read_pid(state_dir):
    try:
        with open(os.path.join(state_dir, PID_FILE)) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 1 else None


def _remove_pid_file(state_dir):
    try:
        os.unlink(os.path.join(state_dir, PID_FILE))
    except FileNotFoundError:
        pass


def alive(pid):
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_state(pid) != "Z"


def _reap(pid):
    # When this process started the server itself (the lab imports us), a dead server stays a
    # zombie of ours until waited for; elsewhere it is not our child and this does nothing.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def process_state(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            data = handle.read()
        return data[data.rindex(b")") + 2 : data.rindex(b")") + 3].decode()
    except (OSError, ValueError):
        return None


def _cmdline(pid):
    """The process's argv as words (empty when unreadable, or for an instant inside execve)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return [w.decode("utf-8", "replace") for w in handle.read().split(b"\0") if w]
    except OSError:
        pass
    try:  # no /proc (not Linux): ps's one line, split at spaces
        return subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True).stdout.decode(
            "utf-8", "replace").split()
    except OSError:
        return []


def _is_server(pid):
    # A pid file can outlive its process and the pid be reused by something else: check both.
    # /proc/PID/cmdline reads empty for an instant while the process is inside execve (the launch
    # script execs the python, which execs the server): read again rather than call it gone.
    for _ in range(50):
        if not alive(pid):
            return False
        cmdline = _cmdline(pid)
        if cmdline:
            # sh -> the launch script -> a wrapper -> python: the one rule, at any point of that chain
            return is_server_argv(cmdline, scripts=(LAUNCH_SCRIPT,))
        time.sleep(0.01)
    return False


def _signal_group(pid, sig):
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(_POLL_S)
    return not alive(pid)


def _healthy(port):
    # No proxies: an operator's http_proxy must not swallow a loopback health check.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open("http://127.0.0.1:%d/health" % int(port), timeout=HEALTH_PROBE_TIMEOUT_S) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(path):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return lines[-_LOG_TAIL_LINES:]


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="process_manager.py", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("start", "stop", "restart", "status"))
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--port", type=int)
    parser.add_argument("--grace", type=float, default=DEFAULT_STOP_GRACE_S)
    parser.add_argument("--health-timeout", type=float, default=DEFAULT_HEALTH_TIMEOUT_S)
    return vars(parser.parse_args(argv))


def run_action(options):
    action = options["action"]
    state_dir = options["state_dir"]
    port = options.get("port")
    grace = float(options.get("grace", DEFAULT_STOP_GRACE_S))
    health_timeout = float(options.get("health_timeout", DEFAULT_HEALTH_TIMEOUT_S))
    if action == "start":
        return start(state_dir, port, health_timeout)
    if action == "stop":
        return stop(state_dir, grace)
    if action == "restart":
        return restart(state_dir, port, grace, health_timeout)
    if action == "status":
        return status(state_dir, port)
    return {"running": None, "pid": None, "healthy": None, "ok": False, "error": "unknown action %r" % action}


def main():
    payload = globals().get("GPUOPS_PAYLOAD")
    if payload is not None:
        options = json.loads(payload.decode("utf-8") if isinstance(payload, bytes) else payload)
        if not isinstance(options, dict) or "action" not in options or "state_dir" not in options:
            sys.stdout.write(json.dumps({"ok": False, "error": "payload needs action and state_dir"}) + "\n")
            return 2
    else:
        options = _parse_args(sys.argv[1:])
    result = run_action(options)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
