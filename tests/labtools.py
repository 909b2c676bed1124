"""Helpers the whole suite shares: where the fixtures are, which old Pythons are here, fingerprints
of a host's files, and the server's view.

Imported as ``labtools`` (tests/conftest.py puts this directory on ``sys.path``).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import locale
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[1]

# The FlashInfer a lab host needs for fusion-sm120 to apply on sm120 (a real wheel, cached): 0.6.17
# is the first whose gen_trtllm_comm_module builds for major 12 (tests/integration/test_kernel_libraries.py).
# With the FlashInfer SGLang 0.5.8 or 0.5.14 pins (0.6.1, 0.6.12) the role refuses by its version,
# as it should on the real box; tests of the patch transaction itself give their host this one.
FUSION_FLASHINFER = "0.6.17"

# Files that move on their own (logs, pid files): never part of "the host is as it was".
VOLATILE = {"sshd.log", "sglang.log", "sglang.pid", "sshd.pid"}


def fixtures_path() -> Path:
    """The test data: ``tests/fixtures`` in this checkout (real captures and hand-written shapes,
    byte-for-byte; see its README). ``$GPUOPS_FIXTURES`` overrides it (a mutant tree in
    benchmarks/promise_mutants points back here). Nothing in the suite reads outside the repo.
    """
    env = os.environ.get("GPUOPS_FIXTURES")
    if env:
        return Path(env)
    return REPO_ROOT / "tests" / "fixtures"


@functools.lru_cache(maxsize=None)
def find_python(version: str) -> str | None:
    """A working ``python<version>`` (e.g. "3.8") for compatibility checks, or None.

    Searched, never hard-coded: ``python3.X`` on PATH (pyenv's shims skipped: they need a shell
    that selected the version), then pyenv's versions under ``$PYENV_ROOT`` or ``~/.pyenv``. Each
    candidate is run once to confirm it is that version. Absent, the test skips with
    ``no python<version> interpreter`` (an allowed skip reason: see tests/conftest.py).
    """
    candidates: list[str] = []
    on_path = shutil.which(f"python{version}")
    if on_path and "/shims/" not in on_path:
        candidates.append(on_path)
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    for versions_dir in sorted((pyenv_root / "versions").glob(f"{version}.*"), reverse=True):
        candidates.append(str(versions_dir / "bin" / f"python{version}"))
    for candidate in candidates:
        try:
            done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


def require_python(version: str) -> str:
    """``find_python(version)``, or skip the calling test with the allowed reason."""
    import pytest

    found = find_python(version)
    if found is None:
        pytest.skip(f"no python{version} interpreter (searched PATH and pyenv)")
    return found


# gpuops' own bookkeeping in a lab host's state dir, which a run is expected to grow: backups
# (runs/), transaction folders (calls/) and the transaction helper's kept compiled modules (bytecode/).
BOOKKEEPING_DIRS = (("state", "runs"), ("state", "calls"), ("state", "bytecode"))


# sha256 of files this process hashed, by what a write to the file changes (device, inode, size, mtime,
# ctime): a lab host's release files are hard links into one cache (the same inodes in every lab), and a
# test hashes its hosts' trees before and after each command, so most of them were read again and again
# (0.2-0.75 CPU-s a tree for SGLang 0.5.8-0.5.23). Only files whose ctime is a second old or more are
# kept: a write sets the ctime to "now" at the clock's coarse tick (milliseconds), so one made in the same
# tick as the hashing could otherwise keep the key unchanged; past that second, any write changes it.
_HASHED: dict[tuple[int, int, int, int, int], str] = {}


def file_sha256(path: Path, info: os.stat_result) -> str:
    """The sha256 of the regular file ``path`` (``info``: its lstat), read once while it is unchanged."""
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    known = _HASHED.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if time.time_ns() - info.st_ctime_ns >= 1_000_000_000:
        _HASHED[key] = digest
    return digest


def progress_records(path: Path) -> list[dict[str, Any]]:
    """The records of a transaction's ``progress.jsonl`` whose lines are whole: the host appends a line
    with one write, which a reader may see half done (a big line, such as the gate audit's, in a whole
    run), so the last line counts only once its newline is there, as the product's own reader does
    (``remote/apply_fileops.read_complete_lines``). A file not there yet has none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def tree_hashes(root: Path, skip_runs: bool = False) -> dict[str, str]:
    """What every entry under a lab host dir is, by relative path: kind, mode and content.

    Files are ``file MODE sha256``, directories ``dir MODE``, symlinks ``link -> TARGET``: a
    rollback that restores bytes but not modes, or leaves a created file or directory behind, or
    follows a symlink instead of restoring it, changes this map.
    ``skip_runs`` leaves out gpuops' own bookkeeping (state/runs backups, state/calls transaction
    folders, state/bytecode where the transaction helper keeps its compiled modules, journal, lock, a
    consumed lab fault file), which an apply or a rollback is expected to grow; everything the server
    reads must still match.
    """
    out: dict[str, str] = {}

    def walk(directory: str, prefix: str) -> None:  # os.scandir: the pathlib walk was most of the cost
        with os.scandir(directory) as entries:
            for entry in entries:
                name, rel = entry.name, prefix + entry.name
                if name == "__pycache__" or (skip_runs and tuple(rel.split("/", 2)[:2]) in BOOKKEEPING_DIRS):
                    continue  # nor anything below it
                info = entry.stat(follow_symlinks=False)
                dot = name.rfind(".")
                listed = not (name in VOLATILE or (0 < dot < len(name) - 1 and name[dot:] == ".pyc")
                              or (skip_runs and name in ("journal.jsonl", "lock", "lab-fault.used")))
                if stat.S_ISLNK(info.st_mode):
                    if listed:
                        out[rel] = f"link -> {os.readlink(entry.path)}"
                elif stat.S_ISDIR(info.st_mode):
                    if listed:
                        out[rel] = f"dir {oct(stat.S_IMODE(info.st_mode))}"
                    walk(entry.path, rel + "/")
                elif listed:
                    out[rel] = f"file {oct(stat.S_IMODE(info.st_mode))} {file_sha256(Path(entry.path), info)}"

    if root.is_dir():
        walk(str(root), "")
    return out


def server_info(port: int) -> dict[str, Any]:
    """The stand-in server's /get_server_info (its flags and environment as it runs)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=10) as response:
        return json.loads(response.read())


def gpuops_cli(*args: str, cwd: "os.PathLike[str] | str", timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``gpuops ARGS`` as a user would, in ``cwd``, without the caller's $GPUOPS_INVENTORY."""
    env = {k: v for k, v in os.environ.items() if k != "GPUOPS_INVENTORY"}
    return run_cli(list(args), env=env, cwd=cwd, timeout=timeout)


# What ``python -m gpuops.cli`` reads from its environment only as the interpreter starts: a
# command whose environment differs from the runner's in any of these runs in a fresh interpreter.
_STARTUP_ENV = ("PYTHON", "LANG", "LC_", "TZ")


class CliZygote:
    """``gpuops ARGS`` as ``python -m gpuops.cli ARGS`` runs it (exit status, stdout, stderr, in its
    own process, cwd and environment), forked from one runner per test process that imported gpuops'
    command line, its command modules and their heavy libraries once (``cli_zygote.py``): a command
    then costs a fork, not the ~0.3 CPU-s of a Python start and those imports (issue 39: ~700 such
    starts a run). For tests of what a command says, does and exits with; what needs a fresh
    interpreter (start-up time, import side effects, signals sent to the client) starts one."""

    _shared: "CliZygote | None" = None

    def __init__(self, env: dict[str, str]) -> None:
        import itertools
        import threading

        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("cli_zygote.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, cwd="/")
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._forked: dict[int, int] = {}
        self._ended: dict[int, int] = {}
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.close)

    @classmethod
    def for_env(cls, env: dict[str, str]) -> "CliZygote | None":
        """The runner for a command with ``env``; None when it must start an interpreter of its own."""
        if cls._shared is None or cls._shared.proc.poll() is not None:
            cls._shared = cls(env)
        same = all(env.get(k) == cls._shared.env.get(k) for k in {*env, *cls._shared.env} if k.startswith(_STARTUP_ENV))
        return cls._shared if same else None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._cond:
                if "id" in message:
                    self._forked[message["id"]] = message["pid"]
                else:
                    self._ended[message["pid"]] = message["status"]
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _wait(self, found: Callable[[], bool], timeout: float) -> bool:
        import time

        deadline = time.monotonic() + timeout
        with self._cond:
            while not found():
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return found()
                self._cond.wait(min(left, 1.0))
            return True

    def run(self, args: "list[str]", *, env: dict[str, str], cwd: "os.PathLike[str] | str", input: "str | None" = None,
            timeout: float = 180) -> "subprocess.CompletedProcess[str]":
        import signal
        import tempfile

        argv = [sys.executable, "-m", "gpuops.cli", *args]
        with tempfile.TemporaryDirectory(prefix="gpuops-cli-") as folder:
            request = {"args": list(args), "cwd": str(cwd), "env": env, "stdin": None,
                       "out": f"{folder}/out", "err": f"{folder}/err"}
            if input is not None:
                Path(folder, "in").write_text(input)
                request["stdin"] = f"{folder}/in"
            assert self.proc.stdin is not None
            with self._cond:
                request["id"] = next(self._ids)
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            if not self._wait(lambda: request["id"] in self._forked, 60):
                raise AssertionError(f"the gpuops runner did not start {args}: exit status {self.proc.poll()}")
            pid = self._forked.pop(request["id"])
            if not self._wait(lambda: pid in self._ended, timeout):
                os.kill(pid, signal.SIGKILL)
                self._wait(lambda: pid in self._ended, 30)
                self._ended.pop(pid, None)
                raise subprocess.TimeoutExpired(argv, timeout, _text(Path(folder, "out")), _text(Path(folder, "err")))
            status = self._ended.pop(pid)
            return subprocess.CompletedProcess(argv, status, _text(Path(folder, "out")), _text(Path(folder, "err")))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _text(path: Path) -> str:
    """A captured stream as ``subprocess.run(text=True)`` gives it: decoded, universal newlines."""
    data = path.read_bytes().decode(locale.getpreferredencoding(False)) if path.exists() else ""
    return data.replace("\r\n", "\n").replace("\r", "\n")


def run_cli(args: "list[str]", *, env: dict[str, str], cwd: "os.PathLike[str] | str", input: "str | None" = None,
            timeout: float = 180) -> "subprocess.CompletedProcess[str]":
    """``gpuops ARGS`` in ``cwd`` with ``env``: forked from the runner (``CliZygote``) when ``env``
    lets it, else ``python -m gpuops.cli ARGS`` in a fresh interpreter."""
    runner = CliZygote.for_env(env)
    if runner is not None:
        return runner.run(args, env=env, cwd=cwd, input=input, timeout=timeout)
    return subprocess.run([sys.executable, "-m", "gpuops.cli", *args], input=input, capture_output=True, text=True,
                          env=env, cwd=str(cwd), timeout=timeout)


def gpuops_cli_forked(commands: "list[tuple[str, ...]]", *, cwd: "os.PathLike[str] | str", env: dict[str, str],
                      timeout: float = 180) -> "list[subprocess.CompletedProcess[str]]":
    """Each of ``commands`` (argument lists) as ``gpuops ARGS``, one after the other (``run_cli``)."""
    return [run_cli(list(c), env=env, cwd=cwd, timeout=timeout) for c in commands]


def wait_for_self_rollback(lock_path: Path, rolled_back: Callable[[], bool], deadline: float) -> None:
    """Wait, until the monotonic ``deadline``, for a host to roll a run back by itself: its worker
    holds the state dir's lock while it works, so the run is over only once the lock is free AND
    ``rolled_back()`` says the journal recorded it. Fails the test past the deadline."""
    import fcntl
    import time

    fd = os.open(lock_path, os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                if rolled_back():
                    return
            except OSError:
                pass  # the worker still holds the lock
            assert time.monotonic() < deadline, "the host did not roll back by itself within the lease"
            time.sleep(0.1)
    finally:
        os.close(fd)


def wait_server_info(port: int, timeout: float = 30) -> dict[str, Any]:
    """``server_info`` once the server answers (it restarts after an apply); fails past ``timeout``."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return server_info(port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def launched(host: Any) -> tuple[bool, dict[str, str]]:
    """Whether the running server has fusion on (its own report of its flags), and its environment."""
    info = server_info(host.server_port)
    args = info.get("server_args") if isinstance(info.get("server_args"), dict) else info
    fused = args.get("enable_flashinfer_allreduce_fusion") is True or \
        args.get("flashinfer_allreduce_fusion_backend") not in (None, "", "none", False)
    return fused, dict(info.get("env") or {})


# A stand-in for sudo: -S reads the password line from stdin only when FAKE_SUDO_ASKS=1 (as a
# NOPASSWD rule would not) and checks it against $FAKE_SUDO_PASSWORD; each call is logged to
# $FAKE_SUDO_LOG when that is set; then it runs the command after `--`.
FAKE_SUDO = """#!/bin/sh
while [ "$1" != "--" ]; do
  if [ "$1" = "-S" ] && [ "$FAKE_SUDO_ASKS" = 1 ]; then
    IFS= read -r pw; [ "$pw" = "$FAKE_SUDO_PASSWORD" ] || { echo "sudo: wrong password" >&2; exit 1; }
  fi
  shift
done
if [ -n "$FAKE_SUDO_LOG" ]; then echo call >> "$FAKE_SUDO_LOG"; fi
shift
exec "$@"
"""


def fake_sudo_bin(tmp_path: Path) -> Path:
    """A fresh ``tmp_path/bin`` holding only ``FAKE_SUDO`` as ``sudo``: put it first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text(FAKE_SUDO)
    (bin_dir / "sudo").chmod(0o755)
    return bin_dir


def rolled_back_count(state_dir: Path) -> int:
    """How many ``rolled_back`` events the host's journal holds (0: no journal yet)."""
    journal = state_dir / "journal.jsonl"
    return sum('"rolled_back"' in line for line in journal.read_text().splitlines()) if journal.exists() else 0


def client_paused_at(state_dir: Path, phase: str, args: list[str], home: Path, timeout: float) -> subprocess.Popen:
    """Start ``gpuops ARGS`` as a user would (its own HOME, no ssh agent) with the host's worker told
    (``lab-fault.json``) to pause at ``phase``; return the running client once the worker has paused
    there. Fails the test (killing the client) if the client exits first or past ``timeout``."""
    import time

    (state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 120}))
    calls_before = set((state_dir / "calls").glob("*"))
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "XDG_STATE_HOME")}
    env["HOME"] = str(home)
    client = subprocess.Popen([sys.executable, "-m", "gpuops.cli", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert client.poll() is None, client.communicate()
            assert time.monotonic() < deadline, f"the worker never paused at {phase}"
            texts = [(c / "progress.jsonl").read_text() for c in set((state_dir / "calls").glob("*")) - calls_before
                     if (c / "progress.jsonl").exists()]
            if any('"paused"' in t and f'"phase": "{phase}"' in t for t in texts):
                return client
            time.sleep(0.05)
    except BaseException:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=30)
        raise


# Scans of real releases kept across test runs, in the user's cache beside the releases themselves
# ($GPUOPS_CACHE or ~/.cache/gpuops): one directory per scanner digest, the newest few kept.
RELEASE_SCANS_DIR = "test-release-scans"
KEPT_SCANNER_DIGESTS = 3  # the current scanner's and two others' (other checkouts, a branch switched back)
_release_scans: dict[tuple[str, bool, int | None], bytes] = {}


def release_scans_root() -> Path:
    from gpuops.lab.sglang_cache import cache_root

    return cache_root().parent / RELEASE_SCANS_DIR


def scanning_python(python: str = "python3") -> dict[str, str]:
    """The interpreter a scan runs as (``scan_site`` hands ``python`` to ``sh``, which finds it on
    PATH, a pyenv shim included): its ``sys.executable`` and ``sys.version`` as it reports them."""
    return _reported_python(python, os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=None)
def _reported_python(python: str, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = path
    report = "import sys; print(sys.executable); print(sys.version)"
    done = subprocess.run(["sh", "-c", f"exec {shlex.quote(python)} -c {shlex.quote(report)}"],
                          capture_output=True, text=True, env=env, timeout=60, check=True)
    executable, version = done.stdout.split("\n", 1)
    return {"executable": executable, "version": version.strip()}


def scan_key(release: str, site: "os.PathLike[str] | str", with_sources: bool, scanner_digest: str,
             python: dict[str, str], options: dict[str, Any]) -> dict[str, Any]:
    """Everything a kept scan of ``site`` depends on: the release (and where it is unpacked: the
    scan reports its root), the scanner's text (``gates.probe.scanner_digest``), what it was asked
    (``scan_options``: with the sources or not, the catalog's keywords) and the python that ran it."""
    return {"release": release, "site": str(site), "with_sources": with_sources, "scanner_digest": scanner_digest,
            "python": dict(python), "options": options}


def release_scan_key(version: str, site: "os.PathLike[str] | str", with_sources: bool,
                     jobs: int | None = None) -> dict[str, Any]:
    """``scan_key`` of a scan by ``scan_site``: this checkout's scanner, options and python3."""
    from gpuops.gates.probe import scan_options, scanner_digest

    return scan_key(version, site, with_sources, scanner_digest(), scanning_python(),
                    scan_options(with_sources, jobs=jobs))


def kept_scan(key: dict[str, Any], scan: Callable[[], tuple[str, str, int]], root: Path) -> Any:
    """The ``GateScan`` of ``key``: the scanner output kept under ``root`` for exactly this key, or
    ``scan()`` (stdout, stderr, exit status) run now and kept when it is a whole scan.

    An entry is used only when the key it records is ``key`` (a torn or foreign file is a miss).
    It is written atomically (a whole file renamed in) under a lock per entry, so two workers, or
    two runs, never scan one key at once. Writing it prunes the directories of all but the
    ``KEPT_SCANNER_DIGESTS`` most recently used scanner digests."""
    from gpuops.gates.scan import parse_scan_output
    from gpuops.lab.file_lock import exclusive_lock

    material = json.dumps(key, sort_keys=True)
    digest_dir = root / key["scanner_digest"]
    jobs = key["options"].get("jobs")
    entry = digest_dir / (f"{key['release']}-{'sources' if key['with_sources'] else 'plain'}-"
                          f"{f'jobs{jobs}-' if jobs else ''}{hashlib.sha256(material.encode()).hexdigest()[:16]}.json")
    digest_dir.mkdir(parents=True, exist_ok=True)
    os.utime(digest_dir)  # this digest is in use: pruning goes by the directories' times
    with exclusive_lock(entry.with_suffix(".lock")):
        try:
            kept = json.loads(entry.read_text())
        except (OSError, ValueError):
            kept = None
        if isinstance(kept, dict) and kept.get("key") == json.loads(material):
            return parse_scan_output(kept["stdout"], kept["stderr"], kept["status"])
        stdout, stderr, status = scan()
        parsed = parse_scan_output(stdout, stderr, status)
        if parsed.known:
            partial = entry.with_suffix(f".{os.getpid()}.partial")
            try:
                partial.write_text(json.dumps({"key": key, "stdout": stdout, "stderr": stderr, "status": status}))
                os.replace(partial, entry)
            except OSError:
                pass  # pruned meanwhile by a run with other scanners: this run has its scan all the same
            prune_scanner_digests(root)
        return parsed


def prune_scanner_digests(root: Path, keep: int = KEPT_SCANNER_DIGESTS) -> None:
    """Remove the kept scans of all but the ``keep`` most recently used scanner digests."""
    used: list[tuple[float, Path]] = []
    for entry in root.iterdir():
        try:
            if entry.is_dir():
                used.append((entry.stat().st_mtime, entry))
        except OSError:
            continue  # removed by another run's pruning
    for _, old in sorted(used, reverse=True)[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def release_scan(version: str, with_sources: bool = False, jobs: int | None = None) -> Any:
    """``scan_site`` of the cached real SGLang ``version`` (``gates.local``, the host's own scanner),
    kept across test runs: a scan of 0.5.23 costs ~6 CPU-s, and a release scans the same way until
    one of the inputs in ``release_scan_key`` changes (``kept_scan``). ``jobs``: the scanner's
    worker processes (``scan_options``; by default the machine's CPUs, at most 8). Parsed once per
    process; each call returns a copy of its own."""
    import pickle

    from gpuops.gates.local import scan_site_output
    from gpuops.lab.sglang_cache import sglang_site

    if (version, with_sources, jobs) not in _release_scans:
        site = sglang_site(version)
        scan = kept_scan(release_scan_key(version, site, with_sources, jobs),
                         lambda: scan_site_output(site, with_sources=with_sources, jobs=jobs), release_scans_root())
        _release_scans[version, with_sources, jobs] = pickle.dumps(scan)
    return pickle.loads(_release_scans[version, with_sources, jobs])


def probe_site(*sites: "os.PathLike[str] | str") -> Any:
    """The software probe as a host runs it (its own text, the catalog's kernel reads as argv) with
    ``sites`` on the python's path, parsed by the client's parser (``facts.software.PythonPackages``)."""
    import json as _json
    import sys as _sys

    from gpuops.facts.software import parse_python_packages, remote_source
    from gpuops.gates.catalog import load_catalog
    from gpuops.gates.kernels import probe_reads
    from gpuops.gather import ProbeOutput

    reads = _json.dumps(probe_reads(load_catalog()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(s) for s in sites)
    done = subprocess.run([_sys.executable, "-S", "-c", remote_source(), reads], capture_output=True, text=True,
                          env=env, timeout=60)
    return parse_python_packages(ProbeOutput(done.stdout, done.stderr, done.returncode))


class WatchedClient:
    """``gpuops ARGS`` started as a user would (its own HOME, no ssh agent), its stderr read as it
    comes, so that a test acts once the client has *said* something (``wait_for``: with ``-v`` the
    client logs each phase of a run once it knows it) rather than after a fixed sleep."""

    def __init__(self, args: list[str], home: Path) -> None:
        import threading

        from gpuops.lab.sglang_cache import cache_root

        env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "XDG_STATE_HOME", "GPUOPS_LAB_DIR")}
        env.update(HOME=str(home), GPUOPS_CACHE=str(cache_root().parent))
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuops.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)
        self._lines: list[str] = []
        self._out: list[bytes] = []
        self._cond = threading.Condition()
        self._readers = [threading.Thread(target=self._read_err, daemon=True),
                         threading.Thread(target=self._read_out, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._cond:
                self._lines.append(raw.decode("utf-8", "replace"))
                self._cond.notify_all()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self._out.append(self.proc.stdout.read())

    def wait_for(self, text: str, timeout: float = 120) -> None:
        """Until a line of stderr holds ``text``; fails (naming what it saw) if the client exits first."""
        import time

        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(text in line for line in self._lines):
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._readers[0].is_alive()):
                    raise AssertionError(f"the client never said {text!r}: {''.join(self._lines)[-3000:]}")
                self._cond.wait(min(left, 0.2))

    def finish(self, timeout: float = 180) -> tuple[str, str, int]:
        """stdout, stderr and the exit status once the client has ended. ``exited_at`` (monotonic)
        is when the client process ended and ``readers_open`` which of its pipes were still open 30 s
        after: a process it left behind holding them (a test that times the client reads both)."""
        import time

        self.proc.wait(timeout=timeout)
        self.exited_at = time.monotonic()
        for reader in self._readers:
            reader.join(30)
        self.readers_open = [name for name, reader in zip(("stderr", "stdout"), self._readers) if reader.is_alive()]
        return b"".join(self._out).decode("utf-8", "replace"), "".join(self._lines), self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
