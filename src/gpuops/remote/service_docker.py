"""The SGLang server as a docker container, driven on the host: recreate, stop, state, identity, logs.

Stdlib only, Python 3.8+: a host module, bundled with the apply helper for ``sglang_manager:
docker``. A container's configuration is fixed when it is created, so a restart is a recreate from
the composed spec: the run script the sglang-service role renders (``docker run -d --name NAME
--env-file ... IMAGE python3 -m sglang.launch_server ...``). The old container is stopped with the
grace time (``docker stop -t``), then removed; the script creates the new one. Rollback restores
the script and env file and recreates again: the previous spec, and with it the previous image.

What runs is read from docker itself (``docker inspect``): a container docker restarted (its
``RestartCount`` grew, ``--restart on-failure``) or that exited is a failed start; the port must be
held by a process of this container.
"""

import json

from gpuops.remote.service_base import DEFAULT_STOP_GRACE_S, ServiceFailed, run_command
from gpuops.remote.ports import port_flag, port_owners, process_tree

_DOCKER_TIMEOUT_S = 300


def _run(argv, timeout=_DOCKER_TIMEOUT_S):
    return run_command(argv, timeout)


class DockerService:
    """One container. ``spec``: the plan's service spec (``name``, ``docker_run_script``, ``grace``)."""

    def __init__(self, spec, run=_run):
        self.spec = spec or {}
        self.name = self.spec.get("name") or "sglang"
        self.run_script = self.spec.get("docker_run_script")
        self.grace = int(float(self.spec.get("grace", DEFAULT_STOP_GRACE_S)))
        self._run = run
        self._started = None  # (container id, RestartCount) of the container we created

    def inspect(self):
        """``docker inspect NAME`` as a dict, or None when there is no such container."""
        done = self._run(["docker", "inspect", "--type", "container", self.name])
        if done.returncode != 0:
            if "No such" in (done.stderr or "") or "no such" in (done.stderr or ""):
                return None
            raise ServiceFailed("docker inspect %s failed: %s" % (self.name, (done.stderr or done.stdout).strip()))
        try:
            return json.loads(done.stdout)[0]
        except (ValueError, IndexError):
            return None

    def facts(self):
        """What docker runs: image (name and id), command, environment names, state, restarts."""
        info = self.inspect()
        if info is None:
            return None
        config, state = info.get("Config") or {}, info.get("State") or {}
        return {
            "id": info.get("Id"), "name": (info.get("Name") or "").lstrip("/"), "image": config.get("Image"),
            "image_id": info.get("Image"), "cmd": config.get("Cmd"), "entrypoint": config.get("Entrypoint"),
            "env": config.get("Env") or [], "running": bool(state.get("Running")), "pid": state.get("Pid"),
            "status": state.get("Status"), "exit_code": state.get("ExitCode"),
            "restart_count": info.get("RestartCount"), "mounts": [m.get("Destination") for m in info.get("Mounts") or []],
            "network_mode": (info.get("HostConfig") or {}).get("NetworkMode"),
        }

    def launch_port(self):
        """``--port`` of the container's command (None when it has none, or no container)."""
        info = self.inspect() or {}
        config = info.get("Config") or {}
        return port_flag(list(config.get("Entrypoint") or []) + list(config.get("Cmd") or []))

    def running(self):
        info = self.inspect()
        if info is None:
            return False, None
        state = info.get("State") or {}
        pid = state.get("Pid") or None
        if self._started is not None:
            container, restarts = self._started
            if info.get("Id") != container or (info.get("RestartCount") or 0) > restarts:
                return False, pid
        return bool(state.get("Running")), pid

    def why_not_running(self):
        info = self.inspect()
        if info is None:
            return "the container %s is gone" % self.name
        state = info.get("State") or {}
        restarts = (info.get("RestartCount") or 0) - (self._started[1] if self._started else 0)
        if self._started is not None and info.get("Id") != self._started[0]:
            return "the container %s was replaced by another one (%s)" % (self.name, (info.get("Id") or "?")[:12])
        if restarts > 0:
            # ExitCode is that of the current state: 0 again once docker has restarted it.
            return "the server exited and docker restarted the container %d time(s) (its restart policy): a failed start" % restarts
        return "the server exited during start-up (container %s, exit code %s%s)" % (
            state.get("Status"), state.get("ExitCode"), ", " + state["Error"] if state.get("Error") else "")

    def restart(self, daemon_reload=False):
        """Recreate: stop (grace time), remove, run the script; remember the new container."""
        if not self.run_script:
            raise ServiceFailed("no docker run script for %s (sglang_docker_run_script)" % self.name)
        self._remove()
        done = self._run(["/bin/sh", self.run_script])
        if done.returncode != 0:
            raise ServiceFailed("docker run (%s) failed (exit %d): %s" % (
                self.run_script, done.returncode, (done.stderr or done.stdout).strip()[-500:]), self.log_tail())
        info = self.inspect()
        if info is None:
            raise ServiceFailed("docker run (%s) created no container named %s" % (self.run_script, self.name))
        self._started = (info.get("Id"), info.get("RestartCount") or 0)

    def stop(self):
        self._remove()

    def _remove(self):
        if self.inspect() is None:
            return
        # `docker rm -f` alone is SIGKILL at once: the server gets its grace time first.
        self._run(["docker", "stop", "-t", str(self.grace), self.name], timeout=self.grace + 60)
        done = self._run(["docker", "rm", "-f", self.name])
        if done.returncode != 0 and self.inspect() is not None:
            raise ServiceFailed("docker rm -f %s failed: %s" % (self.name, (done.stderr or done.stdout).strip()))

    def log_tail(self, lines=25):
        done = self._run(["docker", "logs", "--tail", str(lines), self.name], timeout=30)
        text = (done.stdout or "") + (done.stderr or "")
        return "\n".join(text.splitlines()[-lines:])

    def pids(self):
        info = self.inspect()
        pid = ((info or {}).get("State") or {}).get("Pid")
        return process_tree(pid) if pid else []

    def check_owns_port(self, port):
        """The process answering on ``port`` must be this container's (host network)."""
        pids = self.pids()
        if port_owners(port, pids):
            return
        raise ServiceFailed("port %d answers, but no process of container %s (pids %s) listens on it: another "
                            "process holds the port" % (port, self.name, " ".join(str(p) for p in pids) or "none"),
                            self.log_tail())


def make_service(spec):
    """Entry point for the apply helper (one name for every backend module)."""
    return DockerService(spec)
