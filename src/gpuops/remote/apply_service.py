"""The server as the apply transaction sees it: stop, start, healthy, ours, its log.

``Service`` is the one front the run uses: systemd and docker are driven by their own host modules
(``service_systemd``, ``service_docker``, loaded by ``load_backend``); a plain process by
``process_manager`` (``pm``: a host module bundled with the helper like the others). Health means: ``/health`` answers, then the
model/server info does, from the process gpuops started (it owns the port) running what its launch
script launches. Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

import json
import os
import re
import sys
import time

from gpuops.remote.apply_common import StepFailed
from gpuops.remote.service_base import DEFAULT_HEALTH_TIMEOUT_S, DEFAULT_STOP_GRACE_S, HEALTH_PROBE_TIMEOUT_S, run_command
from gpuops.remote.sglang_argv import flag_value, launch_args
from gpuops.remote.sglang_server import HEALTH_ROUTE, ServerClient, ServerError

_VIEW_CODE = "import json,os,sys; print(json.dumps({'env': dict(os.environ), 'argv': sys.argv[1:]}))"


class Service:
    """How the server runs on this host: restart, health (ours owns the port), log tail."""

    def __init__(self, spec, pm, progress):
        self.spec = spec or {}
        self.manager = self.spec.get("manager", "process")
        # systemd (and later docker) are driven by their own host modules (service_systemd.py, ...).
        self.backend = load_backend(self.manager, self.spec)
        self.state_dir = self.spec.get("state_dir")
        self.port = int(self.spec.get("port", 30000))
        self.grace = float(self.spec.get("grace", DEFAULT_STOP_GRACE_S))
        self.health_timeout = float(self.spec.get("health_timeout", DEFAULT_HEALTH_TIMEOUT_S))
        self.progress = progress
        self.pm = pm

    def running(self):
        if self.backend is not None:
            return backend_call(self.backend.running)
        if self.manager == "process":
            status = self.pm.status(self.state_dir)
            return bool(status.get("running")), status.get("pid")
        raise StepFailed("unknown sglang_manager %r" % self.manager)

    def stop(self):
        if self.backend is not None:
            backend_call(self.backend.stop)
        elif self.manager == "process":
            stopped = self.pm.stop(self.state_dir, self.grace)
            if not stopped.get("ok", True):
                raise StepFailed("stopping the server (pid %s) failed" % stopped.get("pid"))

    def start(self, daemon_reload=False):
        if self.backend is not None:
            backend_call(self.backend.restart, daemon_reload)  # after stop(): a start, with systemd's checks
        elif self.manager == "process":
            started = self.pm.start(self.state_dir)
            if not started.get("ok", True):
                why = started.get("error") or "the server exited at once (exit status unknown)"
                raise StepFailed("starting the server failed: %s%s" % (why, self.port_note()),
                                 "\n".join(started.get("log_tail", [])))
        else:
            raise StepFailed("unknown sglang_manager %r" % self.manager)

    def port_note(self):
        """'; port P is held by pid N (cmd)' when something else listens on the server's port."""
        if self.manager != "process":
            return ""
        owners = self.pm.port_owners(self.port)
        return ("; port %d is held by %s" % (self.port, self.pm.describe_owners(owners))) if owners else ""

    def wait_healthy(self, lease, timeout=None):
        """/health answers 200, then the model's or the server's report does too (asked the way the
        release answers: ``sglang_server``; not on a node of rank > 0: ``worker_node``), and the
        answer comes from the server gpuops started: its process (or a child) owns the socket."""
        timeout = self.health_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self.backend is not None:
            # The port the server was really launched with (a rollback may have moved it back).
            self.port = backend_call(self.backend.launch_port) or self.port
        base = "http://127.0.0.1:%d" % self.port
        stage = "health"
        client, client_pid = None, None
        # Ask often at first, then every 0.25 s: a server that comes back in a second or two (a
        # restarted process, the lab's stand-in) is seen at once, and one that loads a model for
        # minutes is asked four times a second, as before; each question is one loopback request.
        pause = 0.05
        while True:
            lease.check("during the health wait")
            running, pid = self.running()
            if client is None or client_pid != pid:
                # the one server client, with the server's own --api-key (read from its command line)
                client, client_pid = ServerClient.for_process(base, pid, timeout=HEALTH_PROBE_TIMEOUT_S), pid
            if not running:
                why = "the server exited during start-up%s" % self.port_note()
                if self.backend is not None:
                    why = backend_call(self.backend.why_not_running)
                raise StepFailed(why, self.log_tail())
            answered = None
            if stage == "health":
                answered = HEALTH_ROUTE if client.healthy(HEALTH_PROBE_TIMEOUT_S) else None
            else:
                answered = info_route(client)
            if answered and stage == "health" and not worker_node(pid):
                stage = "info"
                continue
            if answered:
                self.check_owner(pid)
                return answered
            if time.monotonic() > deadline:
                raise StepFailed("the server was not healthy within %ds (gpuops_health_timeout)" % timeout,
                                 self.log_tail())
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

    def check_owner(self, pid):
        if self.backend is not None:
            if hasattr(self.backend, "check_owns_port"):
                backend_call(self.backend.check_owns_port, self.port)
            return
        if self.manager != "process" or pid is None:
            return
        if self.pm.owns_port(pid, self.port):
            self.check_launch(pid)
            return
        owners = self.pm.port_owners(self.port)
        raise StepFailed("port %d answers, but not from the server gpuops started (pid %d): it is held by %s"
                         % (self.port, pid, self.pm.describe_owners(owners) if owners else "nobody visible"),
                         self.log_tail())

    def check_launch(self, pid):
        """The server runs what its launch script launches: every variable the script sets (from
        the env file) has that value in the server's environment, and its flags are the script's.

        The script itself says what it launches: it is run by sh, as for a start, with its final
        ``exec`` replaced by a python that prints the environment and the argv it would get."""
        script = os.path.join(self.state_dir or "", "sglang-launch.sh")
        launched = launch_view(script)
        if launched is None:
            return
        environ, cmdline = process_view(pid)
        if environ is None:
            return  # not readable (another user): the port ownership is what can be proven
        for name in sorted(launched["env"]):
            if environ.get(name) != launched["env"][name]:
                raise StepFailed("the server (pid %d) does not run with the environment its launch script sets: "
                                 "%s is %s there" % (pid, name, "missing" if name not in environ else "different"),
                                 self.log_tail())
        # The flags after the launch, however each side spells it (-m sglang.launch_server, sglang serve, ...).
        want, have = launch_args(launched["argv"]), launch_args(cmdline)
        if want is not None and have is not None:
            if want != have:
                raise StepFailed("the server (pid %d) does not run with the flags its launch script gives (%s)"
                                 % (pid, " ".join(have)[:300]), self.log_tail())

    def log_tail(self, lines=25):
        if self.backend is not None:
            try:
                return self.backend.log_tail(lines)
            except Exception as exc:
                return "(no log: %s)" % exc
        try:
            with open(os.path.join(self.state_dir, "sglang.log"), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 16384))
                text = handle.read().decode("utf-8", "replace")
            # Only the last start: earlier runs' lines would hide what went wrong now.
            marker = text.rfind("=== gpuops process_manager: start")
            if marker >= 0:
                text = text[marker:]
        except (OSError, KeyError, TypeError) as exc:
            return "(no log: %s)" % exc
        return "\n".join(text.splitlines()[-lines:])


def launch_view(script):
    """What ``script`` would give the server: the variables it sets and the argv after ``exec``;
    None when it cannot be told (no script, no final exec line)."""
    try:
        with open(script, "r", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    execs = [i for i, line in enumerate(lines) if line.startswith("exec ")]
    if not execs:
        return None
    probe = list(lines)
    # `exec X ARGS` -> `exec PY -c CODE X ARGS`: sh expands X and ARGS exactly as for the start.
    probe[execs[-1]] = "exec %s -c %s %s" % (sh_quote(sys.executable), sh_quote(_VIEW_CODE), lines[execs[-1]][5:])
    base = run_command(["env", "-i", "/bin/sh", "-c", "exec %s -c %s" % (sh_quote(sys.executable), sh_quote(_VIEW_CODE))],
                       timeout=60)
    view = run_command(["env", "-i", "/bin/sh", "-c", "\n".join(probe)], timeout=60)
    try:
        baseline = json.loads(base.stdout)["env"]
        out = json.loads(view.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError, KeyError):
        return None
    env = {k: v for k, v in out["env"].items() if baseline.get(k) != v and k not in ("PWD", "SHLVL", "_", "OLDPWD")}
    return {"env": env, "argv": list(out["argv"])}


def worker_node(pid):
    """Is the server a node of rank > 0 of a multi-node server (``--node-rank N``)? SGLang 0.5.8
    runs no API there, only ``launch_dummy_health_check_server`` (``/health``, ``/ping``) once the
    node joined node 0: its health is ``/health`` alone."""
    if pid is None:
        return False
    words = launch_args(process_view(pid)[1])
    rank = flag_value(words, "--node-rank") if words else None
    return bool(rank) and rank.isdigit() and int(rank) > 0


def process_view(pid):
    """(environment, argv) of a running process from /proc; (None, []) when not readable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            raw = handle.read()
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            argv = [w.decode("utf-8", "surrogateescape") for w in handle.read().split(b"\0") if w]
    except OSError:
        return None, []
    environ = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            environ[name.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return environ, argv


def sh_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def load_backend(manager, spec):
    """The module that drives ``manager`` on the host (bundled with this helper at send time), or
    None when this helper drives that manager itself (the process manager)."""
    if manager == "systemd":
        from gpuops.remote import service_systemd

        return service_systemd.make_service(spec)
    if manager == "docker":
        from gpuops.remote import service_docker

        return service_docker.make_service(spec)
    return None


def backend_call(function, *args):
    """A backend's failure (its ServiceFailed, with the unit's or container's log) as a StepFailed."""
    try:
        return function(*args)
    except StepFailed:
        raise
    except Exception as exc:
        if hasattr(exc, "log_tail"):
            raise StepFailed(str(exc), exc.log_tail)
        raise


def previous_service(spec):
    """The service as the restored files describe it: a run may have moved the port, and the
    previous server must be waited for where it listens (the launch script's --port)."""
    spec = dict(spec or {})
    if spec.get("manager") == "process" and spec.get("state_dir"):
        try:
            with open(os.path.join(spec["state_dir"], "sglang-launch.sh"), "r", encoding="utf-8") as handle:
                found = re.search(r"--port(?:=|'?\s+'?)(\d+)", handle.read())
            if found:
                spec["port"] = int(found.group(1))
        except OSError:
            pass
    return spec


def info_route(client):
    """The route that answered the model's (else the server's) report, or None: not yet."""
    for ask in (client.model_info, client.server_info):
        try:
            ask()
        except ServerError:
            continue
        return client.answered.get("model_info") or client.answered.get("server_info")
    return None
