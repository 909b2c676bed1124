"""A lab host whose SGLang server runs under real systemd: a booted Debian root (``nspawn``)
reached over its own sshd as root, with the stand-in server behind ``sglang.launch_server``.

Inside the container::

    /opt/gpuops-lab/standin_server.py      the stand-in SGLang server (stdlib only)
    /opt/gpuops-lab/standin_sim.py         what it simulates (its sibling)
    /opt/gpuops-lab/speed_model.py, .json  its speed model and documented figures
    /opt/gpuops-lab/sglang_argv.py         gpuops' SGLang argv parser, which the stand-in imports
    /usr/local/bin/python-sglang           `-m sglang.launch_server FLAGS` runs the stand-in
    /etc/systemd/system/sglang.service     the unit, rendered by the sglang-service role itself
    /etc/systemd/system/sglang.service.d/gpuops-env.conf   its drop-in naming the EnvironmentFile
    /var/lib/gpuops/sglang.env             that EnvironmentFile, rendered by the role too

so the host starts exactly as ``gpuops apply sglang-service`` would have left it, and its first
apply shows only the change it is about. Outside, in the caller's directory: the client key, the
known_hosts line of this boot's host key, and ``inventory.yml``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.lab import host_faults, sshd
from gpuops.lab.hosts import STANDIN_SIBLINGS
from gpuops.lab.nspawn import BootedRoot, boot_root
from gpuops.plan.model import FileState, PlanFacts
from gpuops.plan.planner import discover, plan_role
from gpuops.frozen import frozen

STANDIN = Path(__file__).parent / "standin_server.py"
WRAPPER = "/usr/local/bin/python-sglang"
STATE_DIR = "/var/lib/gpuops"
UNIT_DIR = "/etc/systemd/system"
HOST_NAME = "sd1"
HOOKS_DIR = "/opt/gpuops-lab/hooks"  # on the sessions' PYTHONPATH: the lab's gpuops_host_hooks
# The inventory's group vars (short: the stand-in starts and stops in a blink).
GROUP_VARS = {"become": False, "gpuops_health_timeout": 60, "gpuops_stop_grace": 5}


@frozen
class SystemdLabHost:
    name: str
    booted: BootedRoot
    dir: Path
    server_port: int
    host_vars: Mapping[str, Any]

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def unit(self) -> str:
        return str(self.host_vars.get("sglang_service", "sglang")) + ".service"

    def systemctl_show(self, *props: str) -> dict[str, str]:
        """``systemctl show UNIT -p ...`` read from inside the container (by nsenter, not SSH)."""
        argv = ["systemctl", "show", self.unit, "--no-pager"] + [f"--property={p}" for p in props]
        done = self.booted.run(argv)
        if done.returncode != 0:
            raise GpuopsError(f"lab: systemctl show {self.unit}: {done.stderr.strip()}")
        out = {}
        for line in done.stdout.splitlines():
            key, _, value = line.partition("=")
            out[key] = value
        return out

    def stop(self) -> None:
        self.booted.stop()


def _wrapper_text(python: str) -> str:
    return (
        "#!/bin/sh\n"
        "# gpuops lab: the python that runs SGLang here. `-m sglang.launch_server FLAGS` runs the\n"
        "# stand-in server, so the process command line still shows sglang.launch_server and FLAGS.\n"
        'if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then\n'
        f"  exec {python} /opt/gpuops-lab/standin_server.py \"$@\"\n"
        "fi\n"
        f'exec {python} "$@"\n'
    )


def render_service_files(host_vars: Mapping[str, Any]) -> dict[str, str]:
    """What the sglang-service role writes for these variables on a host that has none yet."""

    paths = discover("sglang-service", HOST_NAME, dict(host_vars), {}).paths
    facts = PlanFacts(host=HOST_NAME, files={p: FileState(path=p, exists=False) for p in paths})
    return {c.path: c.after for c in plan_role("sglang-service", facts, dict(host_vars), {}).changes}


def start_systemd_host(lower: Path, workdir: Path, server_args: Sequence[str] = (),
                       server_env: Mapping[str, str] | None = None, start_server: bool = True) -> SystemdLabHost:
    """Boot ``lower`` (a ``debian_root``) in ``workdir`` and set it up as an SGLang host run by systemd."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "client_key"
    if not key.exists():
        sshd.generate_key(key, "gpuops-lab-systemd-client")
    booted = boot_root(lower, workdir / "container", key.with_name("client_key.pub").read_text(),
                       sshd_extra=f"SetEnv GPUOPS_LAB_HOST={HOST_NAME} PYTHONPATH={HOOKS_DIR}\n")
    try:
        server_port = sshd.free_port()
        (booted.path("/opt/gpuops-lab")).mkdir(parents=True, exist_ok=True)
        host_faults.install(booted.path(HOOKS_DIR))  # the lab's fault injection (remote/host_hooks.py)
        shutil.copyfile(STANDIN, booted.path("/opt/gpuops-lab/standin_server.py"))
        for sibling in STANDIN_SIBLINGS:  # the stand-in imports its speed model from its own dir
            shutil.copyfile(sibling, booted.path(f"/opt/gpuops-lab/{sibling.name}"))
        wrapper = booted.path(WRAPPER)
        wrapper.write_text(_wrapper_text("/usr/bin/python3"))
        wrapper.chmod(0o755)
        host_vars: dict[str, Any] = {
            "ansible_host": "127.0.0.1",
            "ansible_port": booted.ssh_port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            "gpuops_python": "/usr/bin/python3",
            "gpuops_state_dir": STATE_DIR,
            "sglang_manager": "systemd",
            "sglang_service": "sglang",
            "sglang_python": WRAPPER,
            "sglang_args": ["--model-path", "/models/stand-in", "--tp", "1", *server_args],
            "sglang_port": server_port,
            "sglang_env": dict(server_env or {}),
        }
        files = render_service_files({**GROUP_VARS, **host_vars})
        for path, text in files.items():
            target = booted.path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o600 if path.endswith(".env") else 0o644)
        # A lab host, as the lab's fault hooks know one (so its fault file is honoured here,
        # never on a real host): the session says so, and a marker sits two levels above the
        # state dir (/var/lib/gpuops -> /var/.gpuops-lab), inside this container only.
        booted.path("/var/.gpuops-lab").write_text("a gpuops lab container (systemd_host)\n")
        (workdir / "known_hosts").write_text(booted.known_hosts_line() + "\n")
        _write_inventory(workdir, host_vars)
        host = SystemdLabHost(name=HOST_NAME, booted=booted, dir=workdir, server_port=server_port,
                              host_vars=host_vars)
        if start_server:
            done = booted.run(["systemctl", "enable", "--now", host.unit])
            if done.returncode != 0:
                raise GpuopsError(f"lab: starting {host.unit} failed: {done.stderr.strip()}")
        return host
    except BaseException:
        booted.stop()
        raise


def _write_inventory(workdir: Path, host_vars: Mapping[str, Any]) -> None:
    import yaml

    data = {"all": {"children": {"systemd_lab": {
        "vars": {"gpuops_known_hosts": str(workdir / "known_hosts"), **GROUP_VARS},
        "hosts": {HOST_NAME: dict(host_vars)},
    }}}}
    (workdir / "inventory.yml").write_text(
        "# gpuops lab: one host whose SGLang runs under systemd (a booted Debian root)\n"
        + yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
