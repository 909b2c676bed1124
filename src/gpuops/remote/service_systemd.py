"""The SGLang server as a systemd unit, driven on the host: restart, stop, state, identity, logs.

Stdlib only, Python 3.8+, one self-contained file: shipped to hosts with the apply helper (which
loads it for ``sglang_manager: systemd``); tests import it too. Everything it reports comes from
systemd itself (``systemctl show``), never from the unit file gpuops wrote, so a drop-in of the
operator's, a unit systemd refused or an EnvironmentFile it read differently shows up as what it is.

A start counts only when systemd keeps the server up: a unit with ``Restart=on-failure`` that
systemd restarts after a crash (``NRestarts`` grows, or it sits in ``auto-restart``) is a failed
start, not a slow one. The journal tail of the unit since the restart explains the failure.
"""

import time

from gpuops.remote.service_base import DEFAULT_STOP_GRACE_S, ServiceFailed, run_command
from gpuops.remote.ports import port_flag, port_owners

SHOW_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "Result", "MainPID", "NRestarts", "ExecStart",
    "Environment", "EnvironmentFiles", "DropInPaths", "FragmentPath", "User", "Group",
    "WorkingDirectory", "Restart", "RestartUSec", "ControlGroup", "NeedDaemonReload",
    "InvocationID", "UnitFileState",
)
_SYSTEMCTL_TIMEOUT_S = 120


def _run(argv, timeout=_SYSTEMCTL_TIMEOUT_S):
    return run_command(argv, timeout)


def unit_name(name):
    return name if "." in name else name + ".service"


def parse_show(text):
    """``systemctl show`` output (``Key=value`` lines) as a dict; values kept verbatim. A key
    shown more than once (one ``EnvironmentFiles=`` line per file) keeps every value, a line each."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = out[key] + "\n" + value if key in out else value
    return out


def environment_entries(value):
    """``Environment=`` as systemctl shows it: space-separated ``K=V``; values with spaces come
    C-quoted (``"K=a b"``) by systemd 247+. Returns the assignments in order."""
    out, word, quote, i = [], [], None, 0
    while i < len(value):
        ch = value[i]
        if quote:
            if ch == "\\" and i + 1 < len(value):
                word.append(value[i + 1])
                i += 2
                continue
            if ch == quote:
                quote = None
            else:
                word.append(ch)
        elif ch in "\"'":
            quote = ch
        elif ch == " ":
            if word:
                out.append("".join(word))
                word = []
        else:
            word.append(ch)
        i += 1
    if word:
        out.append("".join(word))
    return out


def exec_argv(value):
    """The ``argv[]=`` part of ``ExecStart`` as shown (``{ path=... ; argv[]=A B C ; ... }``)."""
    marker = "argv[]="
    start = value.find(marker)
    if start < 0:
        return None
    end = value.find(" ; ", start)
    return value[start + len(marker): end if end >= 0 else len(value)]


class SystemdService:
    """One unit. ``spec``: the plan's service spec (``name``, ``port``, ``grace``)."""

    def __init__(self, spec, run=_run):
        self.spec = spec or {}
        self.name = unit_name(self.spec.get("name") or "sglang.service")
        # The unit's TimeoutStopSec (gpuops_stop_grace): `systemctl stop` and `restart` wait that
        # long for the server's drain before SIGKILL, so their own limit is longer.
        self.grace = float(self.spec.get("grace", DEFAULT_STOP_GRACE_S))
        self._run = run
        self._baseline = None  # (NRestarts, InvocationID) right after our restart
        self._since = None     # journal cursor time of our restart

    # -- what systemd says

    def show(self, properties=SHOW_PROPERTIES):
        argv = ["systemctl", "show", self.name, "--no-pager"] + ["--property=" + p for p in properties]
        done = self._run(argv)
        if done.returncode != 0:
            raise ServiceFailed("systemctl show %s failed: %s" % (self.name, (done.stderr or done.stdout).strip()))
        return parse_show(done.stdout)

    def facts(self):
        """What systemd really runs: the properties above, plus the environment and argv parsed."""
        shown = self.show()
        facts = dict(shown)
        facts["environment"] = environment_entries(shown.get("Environment", ""))
        facts["exec_argv"] = exec_argv(shown.get("ExecStart", ""))
        facts["drop_ins"] = [p for p in shown.get("DropInPaths", "").split() if p]
        return facts

    def launch_port(self):
        """``--port`` of the ExecStart systemd runs now (None when it has none)."""
        argv = exec_argv(self.show(("ExecStart",)).get("ExecStart", "")) or ""
        return port_flag(argv.split())

    def main_pid(self):
        try:
            pid = int(self.show(("MainPID",)).get("MainPID", "0"))
        except ValueError:
            pid = 0
        return pid or None

    def running(self):
        """(running, main pid): active and not restarted by systemd since our restart."""
        shown = self.show(("ActiveState", "SubState", "MainPID", "NRestarts", "InvocationID"))
        try:
            pid = int(shown.get("MainPID", "0")) or None
        except ValueError:
            pid = None
        return shown.get("ActiveState") == "active" and not self._restarted_by_systemd(shown), pid

    def _restarted_by_systemd(self, shown):
        if self._baseline is None:
            return False
        restarts, invocation = self._baseline
        try:
            grown = int(shown.get("NRestarts", "0")) > restarts
        except ValueError:
            grown = False
        return grown or shown.get("SubState") == "auto-restart" or shown.get("InvocationID") != invocation

    def why_not_running(self):
        """One line for a server that is not up: what systemd did with it."""
        shown = self.show(("ActiveState", "SubState", "Result", "NRestarts", "Restart", "LoadState",
                           "ExecMainStatus"))
        if shown.get("LoadState") not in ("loaded", None):
            return "systemd could not load %s (LoadState=%s)" % (self.name, shown.get("LoadState"))
        status = "exit status %s, result %s" % (shown.get("ExecMainStatus"), shown.get("Result"))
        if self._baseline is not None:
            try:
                restarts = int(shown.get("NRestarts", "0")) - self._baseline[0]
            except ValueError:
                restarts = 0
            if restarts > 0:
                return ("the server exited (%s) and systemd restarted it %d time(s) since gpuops started it "
                        "(Restart=%s): a failed start" % (status, restarts, shown.get("Restart")))
            if shown.get("SubState") == "auto-restart":
                return ("the server exited (%s) and systemd is about to restart it (Restart=%s): a failed start"
                        % (status, shown.get("Restart")))
        return "the server exited during start-up (systemd: %s/%s, %s)" % (
            shown.get("ActiveState"), shown.get("SubState"), status)

    # -- changing it

    def daemon_reload_if_needed(self, force=False):
        """``daemon-reload`` when asked or when systemd says the unit on disk changed (a restored
        or removed unit file, a drop-in)."""
        if not force:
            force = self.show(("NeedDaemonReload",)).get("NeedDaemonReload") == "yes"
        if force:
            self._checked(["systemctl", "daemon-reload"], "systemctl daemon-reload")

    def restart(self, daemon_reload=False):
        self.daemon_reload_if_needed(daemon_reload)
        load = self.show(("LoadState", "FragmentPath"))
        if load.get("LoadState") != "loaded":
            raise ServiceFailed("systemd does not know %s (LoadState=%s); is the unit file %s valid?"
                                % (self.name, load.get("LoadState"), load.get("FragmentPath") or "missing"),
                                self.log_tail())
        self._since = time.time()
        # A unit that failed before (a bad start just rolled back, a crash loop) may have hit its
        # start limit: systemd would refuse this restart. Clear that first; it changes nothing else.
        self._run(["systemctl", "reset-failed", self.name])
        # `systemctl restart` resets NRestarts, so the baseline is taken after it.
        self._checked(["systemctl", "restart", self.name], "systemctl restart %s" % self.name, tail=True,
                      timeout=self.stop_timeout())
        shown = self.show(("NRestarts", "InvocationID"))
        try:
            restarts = int(shown.get("NRestarts", "0"))
        except ValueError:
            restarts = 0
        self._baseline = (restarts, shown.get("InvocationID"))

    def stop(self):
        self.daemon_reload_if_needed()
        if self.show(("LoadState",)).get("LoadState") == "not-found":
            return  # its unit file is gone (a new unit rolled back): nothing left to stop
        self._checked(["systemctl", "stop", self.name], "systemctl stop %s" % self.name, timeout=self.stop_timeout())

    def stop_timeout(self):
        return max(_SYSTEMCTL_TIMEOUT_S, self.grace + 60)

    def _checked(self, argv, what, tail=False, timeout=_SYSTEMCTL_TIMEOUT_S):
        done = self._run(argv, timeout)
        if done.returncode != 0:
            raise ServiceFailed("%s failed (exit %d): %s" % (what, done.returncode,
                                                            (done.stderr or done.stdout).strip()[-500:]),
                                self.log_tail() if tail else None)
        return done

    # -- why

    def log_tail(self, lines=25):
        argv = ["journalctl", "-u", self.name, "-n", str(lines), "--no-pager", "-o", "short-iso"]
        if self._since is not None:
            argv += ["--since", "@%d" % int(self._since - 1)]
        done = self._run(argv, timeout=30)
        text = (done.stdout or "") + (done.stderr if done.returncode != 0 else "")
        return "\n".join(text.splitlines()[-lines:])

    # -- identity

    def pids(self):
        """Every process of the unit (its cgroup), from the cgroup file systems this host mounts."""
        group = self.show(("ControlGroup",)).get("ControlGroup", "")
        if not group:
            return []
        for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/systemd"):
            path = base + group + "/cgroup.procs"
            try:
                with open(path) as handle:
                    return [int(p) for p in handle.read().split()]
            except (OSError, ValueError):
                continue
        pid = self.main_pid()
        return [pid] if pid else []

    def check_owns_port(self, port):
        """The process answering on ``port`` must be one of this unit's: an old server still
        holding the port (or any other program) must not pass for the one systemd just started."""
        pids = self.pids()
        if port_owners(port, pids):
            return
        raise ServiceFailed("port %d answers, but no process of %s (pids %s) listens on it: another process "
                            "holds the port" % (port, self.name, " ".join(str(p) for p in pids) or "none"),
                            self.log_tail())


def make_service(spec):
    """Entry point for the apply helper (one name for every backend module)."""
    return SystemdService(spec)
