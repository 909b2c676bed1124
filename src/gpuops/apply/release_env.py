"""The environment of an SGLang release, made ready on a host before the switch (client side).

``gpuops apply sglang-release`` runs this between the plan and the transaction: the wheelhouse
the operator named is streamed to the host as one tar (once per content:
``<envs_dir>/.wheelhouse/<digest>``; never held in memory here), then ``remote/release_env.py`` builds the environment, or finds it finished, and checks it. A
refusal here (disk, an install that fails, a pin the environment does not hold, torch's CUDA
against the driver) ends the host's run before anything stopped: the server, its launch files
and its environment are as they were.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError
from gpuops.plan.release import wheelhouse_digest
from gpuops.shipping import python_command, python_stdin
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.plan.release import ReleaseEnv
    from gpuops.transport import Connection
    from gpuops.transport.stream import Stream


@frozen
class EnvReady:
    """A release's environment ready on the host (built, or found finished, and checked): where it is, the pins
    it holds, torch's CUDA against the driver's, and the environments pruned."""

    env_dir: str
    reused: bool
    installed: dict[str, str | None]
    torch_cuda: str | None
    driver_cuda: str | None
    tool: str | None
    seconds: float | None
    pruned: tuple[str, ...] = ()

    def note(self, version: str) -> str:
        how = "found finished" if self.reused else f"built with {self.tool} in {self.seconds} s"
        cuda = f"; torch CUDA {self.torch_cuda} (driver {self.driver_cuda or 'unknown'})" if self.torch_cuda else ""
        pins = ", ".join(f"{k} {v}" for k, v in sorted(self.installed.items()))
        pruned = f"; removed {len(self.pruned)} environment(s) nothing needs: {', '.join(self.pruned)}" if self.pruned else ""
        return f"SGLang {version}: environment {self.env_dir} {how} ({pins}){cuda}{pruned}"


class EnvRefused(GpuopsError):
    """The host could not make the new environment ready; nothing was changed."""


# The wheelhouse goes to the host as one tar stream, written as it is read (a few hundred KiB at a
# time, never the whole folder in memory: a wheelhouse of torch and its CUDA wheels is several GiB).
_CHUNK = 1 << 20
_COPIED = "gpuops-wheelhouse-copied"
_COPY_TIMEOUT_S = 3600


class _StreamWriter:
    """A file object for ``tarfile`` (mode ``w|``) whose writes go straight to the host's tar."""

    def __init__(self, stream: "Stream", host: str, target: str) -> None:
        self.stream, self.host, self.target = stream, host, target

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK):
            if not self.stream.send(bytes(view[start:start + _CHUNK])):
                raise EnvRefused(f"{self.host}: the copy of the wheelhouse to {self.target} was cut off: "
                                 f"{self.stream.stderr_text().strip()[-300:]} (nothing was changed)")
        return len(data)


def copy_wheelhouse(conn: "Connection", env: "ReleaseEnv", host: str) -> str:
    """Copy the operator's wheelhouse to ``<envs_dir>/.wheelhouse/<digest>`` (skipped when there).

    GNU tar on the host stops at the archive's end marker, so the command ends without the
    stream's stdin being closed, and says how it ended on its stdout."""

    folder = Path(env.wheelhouse).expanduser()
    target = posixpath.join(env.envs_dir, ".wheelhouse", wheelhouse_digest(env.wheelhouse)[:16])
    quoted, partial = shlex.quote(target), shlex.quote(target + ".partial")
    probe = conn.run(f"test -d {quoted}", timeout=60)
    if probe.ok:
        return target
    # Unpacked beside its final name and renamed once complete: a wheelhouse that is there is whole.
    command = (f"rm -rf {partial} && mkdir -p {partial} && tar -x -C {partial} && mv {partial} {quoted} "
               f"&& echo {_COPIED} || echo gpuops-wheelhouse-failed")
    stream = conn.open_stream(command)
    try:
        with tarfile.open(fileobj=_StreamWriter(stream, host, target), mode="w|") as archive:  # type: ignore[call-overload]
            for path in sorted(folder.iterdir()):
                if path.is_file() and path.name.endswith((".whl", ".tar.gz", ".zip")):
                    archive.add(str(path), arcname=path.name)
        line = stream.readline(timeout=_COPY_TIMEOUT_S)
        if line is None or line.strip() != _COPIED.encode():
            raise EnvRefused(f"{host}: cannot copy the wheelhouse {env.wheelhouse} to {target}: "
                             f"{stream.stderr_text().strip()[-300:] or 'tar on the host did not finish'} "
                             "(nothing was changed)")
    finally:
        stream.close()
    return target


def find_ready(conn: "Connection", env: "ReleaseEnv", host: str, python: str | None) -> EnvReady | None:
    """``--check``: the finished environment when the host already has it (checked), else None."""
    return _call(conn, env, host, python, {**env.payload(None), "find_only": True})


def make_ready(conn: "Connection", env: "ReleaseEnv", host: str, python: str | None) -> EnvReady:
    wheelhouse = copy_wheelhouse(conn, env, host) if env.wheelhouse else None
    ready = _call(conn, env, host, python, env.payload(wheelhouse))
    assert ready is not None
    return ready


def _call(conn: "Connection", env: "ReleaseEnv", host: str, python: str | None,
          payload: dict[str, Any]) -> EnvReady | None:
    done = conn.run(python_command(python), stdin=python_stdin("release_env", payload), timeout=7200)
    text = done.stdout_text().strip().splitlines()
    try:
        out: dict[str, Any] = json.loads(text[-1]) if text else {}
    except ValueError:
        out = {}
    if not out:
        raise EnvRefused(f"{host}: the environment build said nothing it could be judged by (exit {done.exit_status}): "
                         f"{done.stderr_text().strip()[-300:]} (nothing was changed)")
    if not out.get("ok"):
        tail = str(out.get("log_tail") or "")
        raise EnvRefused(f"{host}: SGLang {env.version}: {out.get('error')} -- refused before the server stopped, "
                         f"nothing was changed" + (f"\n{tail}" if tail else ""))
    if out.get("found") is False:
        return None
    return EnvReady(str(out["env_dir"]), bool(out.get("reused")), dict(out.get("installed") or {}),
                    out.get("torch_cuda"), out.get("driver_cuda"), out.get("tool"), out.get("seconds"),
                    tuple(str(p) for p in out.get("pruned") or ()))
