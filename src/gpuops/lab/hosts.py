"""Throwaway simulated GPU hosts: real OpenSSH sshd on loopback, a replaying nvidia-smi, the real
SGLang source of a chosen release and a stand-in SGLang server. One implementation for users
(``gpuops lab``) and for the test suite (``tests/conftest.py``).

Layout of a lab directory (every path the lab writes is under it)::

    lab.json  .gpuops-lab           the lab's record (hosts, ports, pids) and its marker
    client_key(.pub) authorized_keys the one client key every host accepts
    known_hosts ssh_config inventory.yml
    lib/fake_nvidia_smi.py lib/standin_server.py lib/standin_sim.py
    lib/speed_model.py lib/speed_model.json lib/sglang_argv.py
    h01/ ssh_host_ed25519_key(.pub) sshd_config sshd.pid sshd.log gpu.json
         bin/nvidia-smi bin/python-sglang  site/  state/  home/

``python
with start_lab(tmp, [LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8")]) as lab:
    subprocess.run(["ssh", "-F", str(lab.ssh_config), "h01", "nvidia-smi", "-L"])
``
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.lab import host_faults, launch_files, processes, sshd
from gpuops.lab.gpu_description import GpuDescription, load_description, with_port
from gpuops.lab import lab_files
from gpuops.lab.lab_files import remove_lab_dir
from gpuops.lab.router import start_router, stop_router
from gpuops.lab.sglang_cache import cache_root, flashinfer_site, sglang_site
from gpuops.lab.site import build_site, release_stack
from gpuops.remote import process_manager
from gpuops.frozen import frozen

LAB_RECORD = "lab.json"
LAB_MARKER = ".gpuops-lab"
STANDIN = Path(__file__).parent / "standin_server.py"
# The stand-in's speed model and its documented figures: imported by the stand-in from its own dir.
# Files the stand-in imports or reads from its own dir, copied next to it wherever it runs.
STANDIN_SIBLINGS = (Path(__file__).parent / "standin_sim.py", Path(__file__).parent / "standin_nodes.py",
                    Path(__file__).parent / "speed_model.py", Path(__file__).parent / "speed_model.json",
                    Path(__file__).parent / "standin_surface.py", Path(__file__).parent / "standin_profile.py",
                    Path(__file__).parents[1] / "remote" / "sglang_argv.py",
                    Path(__file__).parents[1] / "remote" / "sglang_release.py",
                    Path(__file__).parents[1] / "remote" / "scan_fingerprint.py")
REPLAYER = Path(__file__).parent / "fake_nvidia_smi.py"
DEFAULT_SGLANG = "0.5.8"
DEFAULT_GPU = "rtx-pro-6000-x8"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_UNSAFE_PATH = re.compile(r'["%\\\x00-\x1f\x7f]')
_SERVER_HEALTH_TIMEOUT_S = 60.0
_RESERVED_NAMES = {"lib", LAB_RECORD, LAB_MARKER, "client_key", "client_key.pub", "authorized_keys",
                   "known_hosts", "ssh_config", "inventory.yml"}
_WORKERS = 8


@frozen
class LabSpec:
    """``count`` hosts alike. ``sglang=None``: no SGLang installed; ``gpu="none"``: no nvidia-smi."""

    gpu: str = DEFAULT_GPU
    sglang: str | None = DEFAULT_SGLANG
    server: bool = True
    count: int = 1
    names: tuple[str, ...] = ()
    server_env: Mapping[str, str] = field(default_factory=dict)
    server_args: tuple[str, ...] | None = None
    groups: tuple[str, ...] = ()
    # A real FlashInfer Python package on the host (lab/sglang_cache.flashinfer_site) instead of its
    # simulated version data: a release version, or "pinned" for the one the SGLang release pins.
    flashinfer: str | None = None


@frozen
class LabHost:
    name: str
    dir: Path
    port: int
    sshd_pid: int
    gpu: str
    sglang: str | None
    server_port: int | None
    groups: tuple[str, ...] = ()

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"

    @property
    def site_dir(self) -> Path:
        return self.dir / "site"

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def home(self) -> Path:
        return self.dir / "home"


@dataclass
class Lab:
    """A running lab. A context manager: leaving the ``with`` block stops every process of it."""

    root: Path
    hosts: list[LabHost]

    @property
    def inventory_path(self) -> Path:
        return self.root / "inventory.yml"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def client_key(self) -> Path:
        return self.root / "client_key"

    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def ssh_command(self, host: str, *remote: str) -> list[str]:
        """argv for plain OpenSSH to run ``remote`` on ``host`` (words joined by the remote shell)."""
        return ["ssh", "-F", str(self.ssh_config), host, *remote]

    def stop(self, remove: bool = False) -> None:
        stop_lab(self.root, remove=remove)

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@frozen
class _Planned:
    name: str
    spec: LabSpec
    description: GpuDescription | None
    sglang_site: Path | None


def start_lab(
    root: Path | str,
    specs: Sequence[LabSpec],
    add: bool = False,
    progress: Callable[[str], None] | None = None,
    router: str | None = None,
) -> Lab:
    """Start the hosts of ``specs`` in the lab directory ``root`` (``add``: next to existing ones);
    ``router``: an sglang-router release put in front of every server of the lab (``lab/router.py``)."""
    root = Path(root).expanduser().absolute()
    say = progress or (lambda _msg: None)
    _check_root(root)
    sshd.require_openssh()
    existing = load_lab(root) if (root / LAB_RECORD).exists() else None
    if existing is not None and not add:
        raise GpuopsError(f"lab: {root} already holds a lab; `gpuops lab down --dir {root}` first")
    if router is not None and existing is not None:
        raise GpuopsError(f"lab: a router is started with a new lab only (`gpuops lab down --dir {root}` first)")
    if existing is None and root.exists() and any(root.iterdir()):
        raise GpuopsError(f"lab: {root} exists and is not an empty directory or a lab")
    planned = _plan(specs, existing.hosts if existing else [], say)
    for plan in planned:
        # Host dirs live beside the lab's own files (lib/, inventory.yml, ...): never on top of one.
        if plan.name in _RESERVED_NAMES or (root / plan.name).exists():
            raise GpuopsError(f"lab: host name {plan.name!r} clashes with a file of the lab in {root}")
    if any(p.spec.server for p in planned) and not STANDIN.is_file():
        raise GpuopsError(f"lab: the stand-in SGLang server {STANDIN} is missing (use server=False)")
    sshd.ensure_privsep_dir()
    root.mkdir(parents=True, exist_ok=True)
    (root / LAB_MARKER).write_text("A gpuops lab: `gpuops lab down` stops it and removes this directory.\n")
    lab = existing or Lab(root=root, hosts=[])
    try:
        if existing is None:
            _prepare_lab_files(root)
        python = _host_python()
        say(f"starting {len(planned)} host(s)")
        # Each worker starts a host's sshd and launches its server without waiting; the servers
        # boot while the other hosts are set up, then all are awaited together.
        # Ports for every sshd and server at once: distinct within the lab by construction.
        ports = sshd.free_ports(2 * len(planned))
        jobs = [(p, ports[2 * i], ports[2 * i + 1]) for i, p in enumerate(planned)]
        with ThreadPoolExecutor(max_workers=min(_WORKERS, len(planned))) as pool:
            started = list(pool.map(lambda job: _start_host(root, python, *job), jobs))
        lab.hosts.extend(started)
        _prepare_wheelhouses(started, say)
        _write_lab_files(lab, python)
        servers = [h for h, p in zip(started, planned) if p.spec.server]
        if servers:
            say(f"waiting for {len(servers)} stand-in SGLang server(s) to become healthy")
            with ThreadPoolExecutor(max_workers=min(_WORKERS, len(servers))) as pool:
                list(pool.map(_await_server, servers))
        if router is not None:
            _start_router(lab, servers, router, python, say)
    except BaseException:
        # A failed start leaves nothing running, and nothing at all when the lab was new; adding
        # to a running lab, only the new hosts go (the lab keeps its record from before).
        _stop_started(root, None if existing is None else [p.name for p in planned])
        raise
    return lab


def _prepare_wheelhouses(hosts: Sequence[LabHost], say) -> None:
    """The wheelhouse each host's ``apply sglang-release`` installs from (built once, cached). Without
    one (no network for a release's first download) the lab still starts: the inventory then names
    none, and ``apply sglang-release`` wants ``-e sglang_wheelhouse=DIR`` as on any host without an index."""
    wanted = {w for w in (lab_files.host_wheelhouse(h) for h in hosts) if w is not None}
    for wheelhouse in sorted(wanted, key=lambda w: w.folder.name):
        if wheelhouse.folder.is_dir():
            continue
        say(f"building the wheelhouse `apply sglang-release` installs from (SGLang {', '.join(wheelhouse.releases)}; cached)")
        try:
            wheelhouse.build()
        except GpuopsError as exc:
            say(f"no wheelhouse for `apply sglang-release` ({exc}); pass -e sglang_wheelhouse=DIR")


def _start_router(lab: Lab, servers: Sequence[LabHost], version: str, python: str, say) -> None:
    say(f"starting sglang-router {version} in front of {len(servers)} server(s) (installed once; cached)")
    start_router(lab.root, [f"http://127.0.0.1:{h.server_port}" for h in servers], version)
    _write_lab_files(lab, python)  # the inventory names it now


def _stop_started(root: Path, new_hosts: list[str] | None) -> None:
    try:
        if new_hosts is None:
            stop_lab(root, remove=True)
            return
        stop_lab(root, hosts=new_hosts, sweep=False)
        existing = load_lab(root)
        existing.hosts = [h for h in existing.hosts if h.name not in new_hosts]
        _write_lab_files(existing, _host_python())
        for name in new_hosts:
            shutil.rmtree(root / name, ignore_errors=True)
    except Exception:  # the original error is the one worth reporting
        if new_hosts is None:
            processes.sweep(root)


def _check_root(root: Path) -> None:
    if _UNSAFE_PATH.search(str(root)):
        raise GpuopsError(f"lab: {root}: the lab directory path must not contain quotes, %, \\ or control characters")
    if (root / LAB_RECORD).exists() is False and (root / LAB_MARKER).exists():
        raise GpuopsError(f"lab: {root} holds a stopped or broken lab; `gpuops lab down --dir {root}` first")


def _plan(specs: Sequence[LabSpec], existing: Sequence[LabHost], say) -> list[_Planned]:
    taken = {h.name for h in existing}
    number = max([int(h.name[1:]) for h in existing if re.match(r"^h\d+$", h.name)] + [0])
    descriptions: dict[str, GpuDescription | None] = {}
    sites: dict[str, Path] = {}
    planned = []
    for spec in specs:
        if spec.count < 1 or (spec.names and len(spec.names) != spec.count):
            raise GpuopsError(f"lab: a host spec needs count >= 1 and one name per host ({spec})")
        if spec.gpu not in descriptions:
            descriptions[spec.gpu] = load_description(spec.gpu)
        if spec.sglang is not None and spec.sglang not in sites:
            if not (cache_root() / spec.sglang / "site" / "sglang" / "__init__.py").is_file():
                say(f"SGLang {spec.sglang}: downloading the release (once; it is cached)")
            sites[spec.sglang] = sglang_site(spec.sglang)
        for i in range(spec.count):
            if spec.names:
                name = spec.names[i]
            else:
                number += 1
                name = f"h{number:02d}"
            if not _SAFE_NAME.match(name) or name in taken:
                raise GpuopsError(f"lab: host name {name!r} is invalid or already used")
            taken.add(name)
            planned.append(
                _Planned(name, spec, descriptions[spec.gpu], sites.get(spec.sglang) if spec.sglang else None)
            )
    return planned


def _host_python() -> str:
    # The hosts' own python3 (as a login over SSH would find it), not gpuops' virtualenv.
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    return found or shutil.which("python3") or "python3"


def _prepare_lab_files(root: Path) -> None:
    sshd.generate_key(root / "client_key", "gpuops-lab-client")
    shutil.copyfile(root / "client_key.pub", root / "authorized_keys")
    lib = root / "lib"
    lib.mkdir(exist_ok=True)
    shutil.copyfile(REPLAYER, lib / "fake_nvidia_smi.py")
    if STANDIN.is_file():
        shutil.copyfile(STANDIN, lib / "standin_server.py")
        for sibling in STANDIN_SIBLINGS:
            shutil.copyfile(sibling, lib / sibling.name)


def session_env(root: Path, host_dir: Path, name: str, has_gpu: bool) -> dict[str, str]:
    """The environment of every SSH session (and server) on a lab host: what makes it that host. Its
    own temp dir, as a machine has its own /tmp (what a command leaves there is seen); where the
    stand-in keeps what it read from a release, once for every host of the lab (standin_surface.py)."""
    env = {
        "PATH": f"{host_dir / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(host_dir / "home"),
        "TMPDIR": str(host_dir / "tmp"), "PYTHONPATH": str(host_dir / "site"), "LANG": "C.UTF-8",
        "GPUOPS_LAB_HOST": name, processes.LAB_DIR_VAR: str(root),
        "GPUOPS_LAB_SURFACES": str(root / "lib" / "surfaces"),
    }
    if has_gpu:
        env["GPUOPS_LAB_GPU"] = str(host_dir / "gpu.json")
    return env


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _start_host(root: Path, python: str, plan: _Planned, sshd_port: int, server_port: int) -> LabHost:
    host_dir = root / plan.name
    for sub in ("bin", "state", "home", "tmp"):
        (host_dir / sub).mkdir(parents=True, exist_ok=True)
    sshd.generate_key(host_dir / "ssh_host_ed25519_key", f"gpuops-lab-{plan.name}")
    description = plan.description
    quoted_python = launch_files.single_quoted(python)
    # -S: the replayer and the stand-in are stdlib-only (~6 ms less CPU a start without site).
    if description is not None:
        (host_dir / "gpu.json").write_text(json.dumps(description.replay, indent=1))
        _write_executable(
            host_dir / "bin" / "nvidia-smi",
            "#!/bin/sh\n# gpuops lab: a replaying nvidia-smi (simulated GPU, see gpu.json)\n"
            f"GPUOPS_LAB_GPU={launch_files.single_quoted(str(host_dir / 'gpu.json'))}; export GPUOPS_LAB_GPU\n"
            f"exec {quoted_python} -S {launch_files.single_quoted(str(root / 'lib' / 'fake_nvidia_smi.py'))} \"$@\"\n",
        )
    _write_executable(
        host_dir / "bin" / "python-sglang",
        "#!/bin/sh\n"
        "# gpuops lab: the python that runs SGLang on this host. `-m sglang.launch_server FLAGS` runs\n"
        "# the stand-in server, so the process command line still shows sglang.launch_server and FLAGS.\n"
        'if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then\n'
        f"  exec {quoted_python} -S {launch_files.single_quoted(str(root / 'lib' / 'standin_server.py'))} \"$@\"\n"
        "fi\n"
        f'exec {quoted_python} "$@"\n',
    )
    packages = dict(description.packages) if description else {}
    if plan.sglang_site is not None and packages and packages.get("sglang") != plan.spec.sglang:
        # The description's stack belongs to its own sglang: another release brings its own pins.
        packages = release_stack(plan.sglang_site, packages)
    flashinfer = _flashinfer_site(plan, packages)
    build_site(host_dir / "site", plan.sglang_site, packages, flashinfer)
    host_faults.install(host_dir / "site")  # the lab's fault injection, as the host's hooks (remote/host_hooks.py)
    has_server = plan.spec.server_args is not None or (description is not None and description.server is not None)
    if plan.spec.server and not has_server:
        raise GpuopsError(f"lab: {plan.name}: no server to run: the description {plan.spec.gpu!r} has no `server:` "
                          "mapping; add one such as {cmdline: \"python3 -m sglang.launch_server --model-path /models/m "
                          "--tp 8\"} (docs/lab-host-description.md), or start the host without a server (--no-server)")
    if has_server:
        _write_server_files(host_dir, plan, server_port)
    env = session_env(root, host_dir, plan.name, description is not None)
    config = host_dir / "sshd_config"

    def write_config(port: int) -> None:
        config.write_text(
            sshd.sshd_config_text(
                port=port,
                host_key=host_dir / "ssh_host_ed25519_key",
                pid_file=host_dir / "sshd.pid",
                authorized_keys=root / "authorized_keys",
                session_env=env,
            )
        )

    # sshd's per-connection children inherit its environment: the marker lets `lab down` find them.
    sshd_env = {**os.environ, processes.LAB_DIR_VAR: str(root)}
    started = sshd.start_with_free_port(
        write_config, config, host_dir / "sshd.log", host_dir / "sshd.pid", sshd_env, first_port=sshd_port
    )
    host = LabHost(
        name=plan.name,
        dir=host_dir,
        port=started.port,
        sshd_pid=started.pid,
        gpu=plan.spec.gpu,
        sglang=plan.spec.sglang,
        server_port=server_port if has_server else None,
        groups=tuple(plan.spec.groups),
    )
    if plan.spec.server:
        _launch_server(root, host)
    return host


def _flashinfer_site(plan: _Planned, packages: dict[str, str]) -> Path | None:
    """The real FlashInfer release the spec asks for (downloaded once, cached), or None."""
    wanted = plan.spec.flashinfer
    if not wanted:
        return None
    version = packages.get("flashinfer-python") if wanted == "pinned" else wanted
    if not version:
        raise GpuopsError(f"lab: {plan.name}: --flashinfer pinned, but SGLang {plan.spec.sglang} pins no flashinfer-python")

    packages["flashinfer-python"] = version
    return flashinfer_site(version)


def _write_server_files(host_dir: Path, plan: _Planned, port: int) -> None:
    description = plan.description
    server = description.server if description else None
    args = list(plan.spec.server_args) if plan.spec.server_args is not None else list(server.args if server else [])
    env = {**(server.env if server else {}), **plan.spec.server_env}
    if server is not None and server.model_config is not None and plan.spec.server_args is None:
        args = _with_model_dir(args, host_dir / "models", server.model_config)
    state = host_dir / "state"
    launch_files.write_launch_files(state, plan.name, str(host_dir / "bin" / "python-sglang"),
                                    with_port(args, port), env, port)
    (state / "server.json").write_text(json.dumps({"args": with_port(args, port), "env": env, "port": port}))


def _with_model_dir(args: list[str], models: Path, config: Mapping[str, Any]) -> list[str]:
    """Write the model's config.json under the host's models/ and point --model-path at it."""
    if "--model-path" not in args[:-1]:
        return args
    i = args.index("--model-path") + 1
    model_dir = models / (Path(args[i]).name or "model")
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
    return [*args[:i], str(model_dir), *args[i + 1:]]


def _launch_server(root: Path, host: LabHost) -> None:
    env = session_env(root, host.dir, host.name, (host.dir / "gpu.json").exists())
    result = process_manager.start(str(host.state_dir), port=host.server_port, health_timeout=0, env=env)
    if not result.get("ok"):
        raise _server_error(host, result)


def _await_server(host: LabHost) -> None:
    deadline = time.monotonic() + _SERVER_HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        state = process_manager.status(str(host.state_dir), host.server_port)
        if not state["running"] and not process_manager.status(str(host.state_dir))["running"]:
            raise _server_error(host, {"error": "the server exited during start-up",
                                       "log_tail": process_manager.log_tail(str(host.state_dir / "sglang.log"))})
        if state["healthy"]:
            return
        time.sleep(0.05)
    raise _server_error(host, {"error": f"not healthy after {_SERVER_HEALTH_TIMEOUT_S:.0f} s"})


def _server_error(host: LabHost, result: Mapping[str, Any]) -> GpuopsError:
    tail = " | ".join(line for line in result.get("log_tail", [])[-3:] if line.strip())
    return GpuopsError(f"lab: {host.name}: the stand-in server did not start: {result.get('error')}"
                       + (f" ({tail})" if tail else ""))


def _write_lab_files(lab: Lab, python: str) -> None:
    root = lab.root
    (root / "known_hosts").write_text(
        "".join(sshd.host_key_line(h.port, h.dir / "ssh_host_ed25519_key.pub") + "\n" for h in lab.hosts)
    )
    (root / "ssh_config").write_text(lab_files.ssh_config_text(root, lab.hosts, getpass.getuser()))
    (root / "inventory.yml").write_text(lab_files.inventory_text(root, lab.hosts, getpass.getuser(), python))
    _write_record(lab)


def relabel_gpu(lab: Lab, name: str, gpu: str) -> Lab:
    """Record ``gpu`` as the description host ``name`` simulates (e.g. after moving its file)."""
    lab.hosts = [replace(h, gpu=gpu) if h.name == name else h for h in lab.hosts]
    _write_lab_files(lab, _host_python())
    return lab


def _write_record(lab: Lab) -> None:
    record = {
        "version": 1,
        "root": str(lab.root),
        "hosts": [
            {**asdict(h), "dir": str(h.dir), "groups": list(h.groups)} for h in lab.hosts
        ],
    }
    tmp = lab.root / (LAB_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, lab.root / LAB_RECORD)


def load_lab(root: Path | str) -> Lab:
    root = Path(root).expanduser().absolute()
    path = root / LAB_RECORD
    try:
        record = json.loads(path.read_text())
        hosts = [
            LabHost(**{**h, "dir": Path(h["dir"]), "groups": tuple(h.get("groups", ()))})
            for h in record["hosts"]
        ]
    except FileNotFoundError:
        raise GpuopsError(f"lab: no lab at {root} (no {LAB_RECORD}); start one with `gpuops lab up`") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GpuopsError(f"lab: {path}: unreadable lab record ({exc})") from None
    return Lab(root=root, hosts=hosts)


@frozen
class HostStatus:
    name: str
    port: int
    sshd_alive: bool
    server_port: int | None
    server_running: bool
    server_healthy: bool | None
    server_pid: int | None
    gpu: str
    sglang: str | None


def lab_status(lab: Lab) -> list[HostStatus]:
    def one(host: LabHost) -> HostStatus:
        sshd_ok = _is_our_sshd(host.sshd_pid, host.dir)
        server = process_manager.status(str(host.state_dir), host.server_port)
        return HostStatus(
            name=host.name,
            port=host.port,
            sshd_alive=sshd_ok,
            server_port=host.server_port,
            server_running=bool(server["running"]),
            server_healthy=server["healthy"],
            server_pid=server["pid"],
            gpu=host.gpu,
            sglang=host.sglang,
        )

    if not lab.hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(_WORKERS, len(lab.hosts))) as pool:
        return list(pool.map(one, lab.hosts))


def _is_our_sshd(pid: int | None, host_dir: Path) -> bool:
    # The pid file may outlive sshd and the pid be reused: the config path must be on its cmdline.
    return pid is not None and pid > 0 and processes.alive(pid) and str(host_dir / "sshd_config") in processes.cmdline(pid)


def stop_lab(
    root: Path | str,
    remove: bool = False,
    grace: float = 5.0,
    hosts: Sequence[str] | None = None,
    sweep: bool = True,
) -> list[int]:
    """Stop every server and sshd of the lab at ``root``, then anything else it left running.

    Returns the pids the final sweep had to kill. ``remove`` deletes the directory afterwards
    (only a directory marked as a lab). ``hosts``: only these hosts (and no directory removal).
    ``sweep``: kill whatever else carries the lab's marker (the whole lab's, not one host's).
    """

    root = Path(root).expanduser().absolute()
    if not root.exists():
        raise GpuopsError(f"lab: no lab at {root}")
    if not (root / LAB_MARKER).exists():
        raise GpuopsError(f"lab: {root} is not a gpuops lab directory (no {LAB_MARKER}); not touching it")
    host_dirs = sorted(p.parent for p in root.glob("*/sshd_config"))
    if hosts is not None:
        host_dirs = [d for d in host_dirs if d.name in set(hosts)]
        remove = False

    def stop_host(host_dir: Path) -> None:
        if (host_dir / "state").is_dir():
            process_manager.stop(str(host_dir / "state"), grace)
        pid = processes.read_pid(host_dir / "sshd.pid")
        if pid and _is_our_sshd(pid, host_dir):
            processes.kill_sshd_tree(pid)

    if hosts is None:  # the router first: it would only see the servers go
        stop_router(root, grace)
    if host_dirs:
        # Stopping is waiting on processes to exit, not work: one thread per host.
        with ThreadPoolExecutor(max_workers=min(64, len(host_dirs))) as pool:
            list(pool.map(stop_host, host_dirs))
    leftovers = processes.sweep(root) if sweep else []
    if remove:
        remove_lab_dir(root)
    return leftovers
