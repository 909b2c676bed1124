"""Shared parts of the overhead benchmarks: lab hosts, the competitor tools, timing, reporting.

Every figure is a wall-clock time of a whole command as a user would type it (process start-up
included), measured interleaved (tool A, B, C, A, B, C, ...) so that a slow moment of the machine
hits every tool alike; we report the median. Nothing here is simulated: the hosts are real OpenSSH
servers on 127.0.0.1 started by gpuops' own lab, and every tool really connects to them.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BENCH_VENV = Path(os.environ.get("GPUOPS_BENCH_VENV", "~/.cache/gpuops/bench-venv")).expanduser()
COMPETITOR_PACKAGES = ("pyinfra", "ansible-core")

# The FlashInfer release the lab hosts get where a benchmark applies fusion-sm120: the lab's
# simulated FlashInfer is the one SGLang 0.5.8 pins (0.6.1), which cannot build the fused kernel
# for SM120, so gpuops rightly refuses the role there. 0.6.17 is the first that builds it (the
# same release as tests/labtools.py FUSION_FLASHINFER); a real wheel, downloaded once and cached.
FUSION_FLASHINFER = "0.6.17"

SMOKE_HELP = ("one round of the smallest sizes, no warm-up, no figures to keep: checks that the script still "
              "runs end to end (CI runs it so; exit status 1 when anything it runs fails)")


# ---------------------------------------------------------------------------------------------
# Command-line helpers


def host_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise SystemExit(f"--hosts wants a comma-separated list of numbers, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise SystemExit(f"--hosts wants positive numbers, got {text!r}")
    return counts


def gpuops_executable() -> list[str]:
    """The `gpuops` console script of the Python running this benchmark (what users type)."""
    beside = Path(sys.executable).parent / "gpuops"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("gpuops")
    if found:
        return [found]
    return [sys.executable, "-m", "gpuops.cli"]


def bytecode_as_installed(cache: Path | None = None) -> None:
    """Let gpuops' modules keep their bytecode between runs, as an installed gpuops has it.

    A pip install compiles every module; an editable checkout run under
    ``PYTHONDONTWRITEBYTECODE=1`` (as this project's machine sets it) recompiles ~100 modules on
    every command, which no user pays. Bytecode goes to a cache dir, never into the source tree.
    The first (warm-up) run writes it. Called by each benchmark before it times anything; the
    competitors' own packages were compiled by pip and are unaffected.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if cache is None and os.environ.get("PYTHONPYCACHEPREFIX"):
        return  # a prefix of the caller's (the test suite's session dir): share its bytecode, compile once
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache or Path.home() / ".cache" / "gpuops" / "bench-pycache")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The throwaway venv with the tools we compare against


def ensure_bench_venv(venv: Path = BENCH_VENV) -> Path:
    """A venv with pyinfra and ansible-core (created once, reused); returns its bin directory."""
    bin_dir = venv / "bin"
    if (bin_dir / "pyinfra").exists() and (bin_dir / "ansible-playbook").exists():
        return bin_dir
    log(f"bench: installing {' '.join(COMPETITOR_PACKAGES)} into {venv} (once)")
    if not (bin_dir / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *COMPETITOR_PACKAGES],
        check=True,
    )
    return bin_dir


def smoke_bin_dir(tool: str) -> Path | None:
    """Where a smoke run finds a competitor: beside this Python (the [test] extra installs
    ansible-core there, so CI has ansible-playbook), else the bench venv if it was made already.
    Never installs anything: creating the bench venv took 57 s on a fresh machine, too much for CI."""
    for bin_dir in (Path(sys.executable).parent, BENCH_VENV / "bin"):
        if (bin_dir / tool).exists():
            return bin_dir
    return None


def require_smoke_bin_dir(tool: str) -> Path:
    found = smoke_bin_dir(tool)
    if found is None:
        raise SystemExit(f"bench --smoke: {tool} is neither beside {sys.executable} nor in {BENCH_VENV}/bin: "
                         "install the [test] extra (pip install -e '.[test]') or run once without --smoke")
    return found


def tool_versions(bin_dir: Path | None) -> dict[str, str]:
    versions: dict[str, str] = {"python": platform.python_version()}
    try:
        from importlib.metadata import version

        versions["gpuops"] = version("gpuops")
    except Exception:
        pass
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True)
    versions["openssh"] = (ssh.stderr or ssh.stdout).strip()
    if bin_dir is not None:
        # The three versions read by that Python's own importlib.metadata: what `pip list` printed,
        # without pip listing (and importing itself for) every package of the venv (5 s wall at load 14).
        probe = subprocess.run([str(bin_dir / "python"), "-c", _VERSIONS_PROBE, *VERSIONED_TOOLS], capture_output=True,
                               text=True)
        try:
            versions.update(json.loads(probe.stdout))
        except ValueError:
            pass
    return versions


VERSIONED_TOOLS = ("pyinfra", "ansible-core", "paramiko")
_VERSIONS_PROBE = """
import importlib.metadata, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def machine_description() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


# ---------------------------------------------------------------------------------------------
# Lab hosts


@dataclass
class LabHosts:
    """Hosts to benchmark against: an inventory gpuops reads, their known_hosts, and the hosts."""

    inventory_path: Path
    known_hosts: Path
    hosts: list[Any]  # gpuops.inventory.Host
    stop: Callable[[], None] = lambda: None


def start_lab_hosts(count: int, root: Path, gpu: str, sglang: str | None, remove: bool,
                    flashinfer: str | None = None) -> LabHosts:
    """Start `count` real sshd lab hosts with gpuops' own lab (the same code `gpuops lab up` runs);
    `flashinfer`: a real FlashInfer release on each host (`gpuops lab up --flashinfer`)."""
    from gpuops.inventory import load_inventory
    from gpuops.lab.hosts import LabSpec, start_lab

    lab = start_lab(root, [LabSpec(gpu=gpu, sglang=sglang, count=count, flashinfer=flashinfer)], progress=log)
    try:
        hosts = list(load_inventory(str(lab.inventory_path)).select(None))
    except BaseException:
        lab.stop()
        raise
    return LabHosts(Path(lab.inventory_path), Path(lab.known_hosts), hosts, lambda: lab.stop(remove=remove))


def existing_lab_hosts(inventory: Path, known_hosts: Path) -> LabHosts:
    from gpuops.inventory import load_inventory

    return LabHosts(inventory, known_hosts, list(load_inventory(str(inventory)).select(None)))


def subset_inventory(lab: LabHosts, count: int, directory: Path) -> Path:
    """A gpuops (and Ansible) YAML inventory with the first `count` lab hosts, vars already merged."""
    hosts = lab.hosts[:count]
    data = {"all": {"hosts": {host.name: _plain(dict(host.vars)) for host in hosts}}}
    for host, entry in zip(hosts, data["all"]["hosts"].values()):
        # Make the connection explicit (names, ports and keys as gpuops resolved them).
        entry.setdefault("ansible_host", host.address or host.name)
        if host.port is not None:
            entry["ansible_port"] = host.port
        if host.user is not None:
            entry["ansible_user"] = host.user
        if host.key_file is not None:
            entry["ansible_ssh_private_key_file"] = host.key_file
        entry.setdefault("gpuops_known_hosts", str(lab.known_hosts))
    path = directory / f"inventory-{count}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Raw OpenSSH: the floor


def ssh_argv(host: Any, known_hosts: Path, remote_command: str) -> list[str]:
    """Plain OpenSSH with the host key checked against the lab's known_hosts; no multiplexing."""
    argv = [
        "ssh",
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "ControlMaster=no",
        "-o",
        "LogLevel=ERROR",
    ]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.key_file:
        argv += ["-i", host.key_file, "-o", "IdentitiesOnly=yes"]
    target = host.address or host.name
    if host.user:
        target = f"{host.user}@{target}"
    return [*argv, target, remote_command]


def run_ssh_in_parallel(jobs: Sequence[tuple[list[str], bytes]], timeout: float) -> list[tuple[int, bytes, bytes]]:
    """Start every ssh at once (like `ssh ... & ssh ... & wait`) and collect their outputs."""
    import threading

    results: list[tuple[int, bytes, bytes]] = [(-1, b"", b"")] * len(jobs)

    def one(index: int, argv: list[str], stdin: bytes) -> None:
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
            results[index] = (done.returncode, done.stdout, done.stderr)
        except subprocess.TimeoutExpired:
            results[index] = (-9, b"", b"timed out")

    threads = [threading.Thread(target=one, args=(i, argv, stdin)) for i, (argv, stdin) in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# ---------------------------------------------------------------------------------------------
# pyinfra and ansible-playbook


def pyinfra_inventory(hosts: Sequence[Any], known_hosts: Path, host_data: Callable[[Any], dict[str, Any]], path: Path) -> Path:
    entries = []
    for host in hosts:
        data: dict[str, Any] = {
            "ssh_hostname": host.address or host.name,
            "ssh_known_hosts_file": str(known_hosts),
            "ssh_strict_host_key_checking": "yes",
        }
        if host.port:
            data["ssh_port"] = host.port
        if host.user:
            data["ssh_user"] = host.user
        if host.key_file:
            data["ssh_key"] = host.key_file
        data.update(host_data(host))
        entries.append((host.name, data))
    path.write_text(
        "# generated by gpuops benchmarks: the lab hosts, for pyinfra\n" f"hosts = {entries!r}\n", encoding="utf-8"
    )
    return path


def ansible_inventory(hosts: Sequence[Any], known_hosts: Path, host_data: Callable[[Any], dict[str, Any]], path: Path) -> Path:
    entries: dict[str, Any] = {}
    for host in hosts:
        entry: dict[str, Any] = {
            "ansible_host": host.address or host.name,
            # The same host-key checking as the others: the lab's known_hosts, strictly.
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes",
            # Known interpreter: spares Ansible its discovery round trip (in its favour).
            "ansible_python_interpreter": host.vars.get("gpuops_python") or shutil.which("python3") or "python3",
        }
        if host.port:
            entry["ansible_port"] = host.port
        if host.user:
            entry["ansible_user"] = host.user
        if host.key_file:
            entry["ansible_ssh_private_key_file"] = host.key_file
        entry.update(host_data(host))
        entries[host.name] = entry
    path.write_text(
        "# generated by gpuops benchmarks: the lab hosts, for ansible-playbook\n"
        + yaml.dump({"all": {"hosts": entries}}, Dumper=_UnsafeDumper, sort_keys=False, width=1 << 20),
        encoding="utf-8",
    )
    return path


class Unsafe(str):
    """A string Ansible must not template (written with YAML's `!unsafe` tag)."""


class _UnsafeDumper(yaml.SafeDumper):
    pass


def _represent_unsafe(dumper: yaml.SafeDumper, value: Unsafe) -> yaml.Node:
    return dumper.represent_scalar("!unsafe", str(value), style="|" if "\n" in value else None)


_UnsafeDumper.add_representer(Unsafe, _represent_unsafe)


def dump_ansible_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_UnsafeDumper, sort_keys=False, width=1 << 20)


def ansible_env(control_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            # A fresh ControlPath directory per run: every run connects cold, like the others.
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(control_dir / "tmp"),
            # No ansible.cfg from the cwd or home changes the run: an empty one of our own.
            "ANSIBLE_CONFIG": str(_empty_ansible_cfg(control_dir)),
        }
    )
    return env


def _empty_ansible_cfg(directory: Path) -> Path:
    path = directory / "ansible.cfg"
    path.write_text("# generated by gpuops benchmarks: Ansible's defaults\n[defaults]\n", encoding="utf-8")
    return path


def close_ansible_masters(control_dir: Path) -> None:
    """Stop the ControlPersist ssh masters Ansible left behind (they would idle for 60 s)."""
    if not control_dir.is_dir():
        return
    for socket_path in control_dir.iterdir():
        if socket_path.is_socket():
            subprocess.run(
                ["ssh", "-F", "/dev/null", "-o", f"ControlPath={socket_path}", "-O", "exit", "bench"],
                capture_output=True,
                timeout=10,
            )


# ---------------------------------------------------------------------------------------------
# Timing and reporting


@dataclass
class Sample:
    seconds: float
    ok: bool
    detail: str = ""
    load: float | None = None  # 1-minute load average when the run started (a busy machine shows)


@dataclass
class Contender:
    """One way of doing the job, timed as a whole; `check` decides whether a run did the job."""

    name: str
    run: Callable[[], Sample]
    command: str  # what it runs, for the report


def timed(argv: list[str], check: Callable[[subprocess.CompletedProcess], str | None], env: dict[str, str] | None = None,
          cwd: Path | None = None, timeout: float = 1800.0) -> Sample:
    """Run a command and time it from exec to exit; `check` returns why a run failed, or None."""
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, env=env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Sample(time.perf_counter() - start, False, f"timed out after {timeout:.0f} s")
    seconds = time.perf_counter() - start
    problem = check(done)
    if problem is None and done.returncode != 0:
        problem = f"exit status {done.returncode}"
    if problem:
        tail = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-3:]
        return Sample(seconds, False, f"{problem}: {' | '.join(tail)}")
    return Sample(seconds, True)


@dataclass
class Result:
    hosts: int
    tool: str
    command: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def ok_seconds(self) -> list[float]:
        return [s.seconds for s in self.samples if s.ok]

    @property
    def median(self) -> float | None:
        return statistics.median(self.ok_seconds) if self.ok_seconds else None

    def paired_ratio(self, floor: Result | None) -> float | None:
        """Median over rounds of (this run / the floor's run in the same round): robust to a
        machine whose load drifts, since both runs of a round meet the same moment."""
        if floor is None or len(floor.samples) != len(self.samples):
            return None
        ratios = [a.seconds / b.seconds for a, b in zip(self.samples, floor.samples) if a.ok and b.ok and b.seconds > 0]
        return statistics.median(ratios) if ratios else None

    def as_json(self, floor: Result | None) -> dict[str, Any]:
        ok = self.ok_seconds
        floor_median = floor.median if floor is not None else None
        paired = self.paired_ratio(floor)
        return {
            "hosts": self.hosts,
            "tool": self.tool,
            "command": self.command,
            "runs_s": [round(s.seconds, 4) for s in self.samples],
            "runs_ok": [s.ok for s in self.samples],
            "load_1min_at_start": [None if s.load is None else round(s.load, 2) for s in self.samples],
            "ok_runs": len(ok),
            "failed_runs": [s.detail for s in self.samples if not s.ok],
            "median_s": None if self.median is None else round(self.median, 4),
            "min_s": round(min(ok), 4) if ok else None,
            "max_s": round(max(ok), 4) if ok else None,
            "ratio_to_floor": None if (self.median is None or not floor_median) else round(self.median / floor_median, 2),
            "paired_ratio_to_floor": None if paired is None else round(paired, 2),
        }


def floors_by_hosts(results: Sequence[Result], floor_tool: str) -> dict[int, Result]:
    return {r.hosts: r for r in results if r.tool == floor_tool}


def wait_for_quiet(max_load: float | None, patience_s: float = 300.0) -> None:
    """Wait (up to `patience_s`) until the 1-minute load average is below `max_load`."""
    if max_load is None:
        return
    deadline = time.monotonic() + patience_s
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(2.0)


def measure(hosts: int, contenders: Sequence[Contender], runs: int, warmup: int = 1,
            max_load: float | None = None) -> list[Result]:
    """Interleaved runs: every contender once per round; the first `warmup` rounds are not kept."""
    results = [Result(hosts, c.name, c.command) for c in contenders]
    for round_index in range(warmup + runs):
        wait_for_quiet(max_load)
        for contender, result in zip(contenders, results):
            load = os.getloadavg()[0]
            sample = contender.run()
            sample.load = load
            kept = round_index >= warmup
            log(
                f"bench: {hosts:>3} hosts  {contender.name:<18} {'run' if kept else 'warm-up'} "
                f"{round_index - warmup + 1 if kept else round_index + 1}: {sample.seconds:7.3f} s  (load {load:.1f})"
                + ("" if sample.ok else f"  FAILED ({sample.detail})")
            )
            if kept:
                result.samples.append(sample)
    return results


def render_table(results: Sequence[Result], floor_tool: str, target_ratio: float) -> str:
    lines = [
        f"{'hosts':>5}  {'tool':<18} {'median s':>9} {'min s':>8} {'max s':>8} {'ok/runs':>8} {'x floor':>8} {'paired':>7}",
    ]
    floors = floors_by_hosts(results, floor_tool)
    for result in results:
        floor = floors.get(result.hosts)
        ok = result.ok_seconds
        ratio = f"{result.median / floor.median:.2f}" if (result.median and floor and floor.median) else "-"
        paired = result.paired_ratio(floor)
        lines.append(
            f"{result.hosts:>5}  {result.tool:<18} "
            f"{_fmt(result.median):>9} {_fmt(min(ok) if ok else None):>8} {_fmt(max(ok) if ok else None):>8} "
            f"{len(ok):>3}/{len(result.samples):<4} {ratio:>8} {'-' if paired is None else f'{paired:.2f}':>7}"
        )
    lines.append(
        f"x floor: median / {floor_tool} median; paired: median over rounds of run / {floor_tool} run of the same round"
    )
    lines.append(f"target: gpuops <= {target_ratio:g} x the {floor_tool} floor")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def scratch_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def shell_join(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
