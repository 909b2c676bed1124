"""The environment of an SGLang release, made ready on a host before the switch (client side).

``gpuops apply sglang-release`` runs this between the plan and the transaction: the wheelhouse
the operator named is copied to the host (once per content: ``<envs_dir>/.wheelhouse/<digest>``),
then ``remote/release_env.py`` builds the environment, or finds it finished, and checks it. A
refusal here (disk, an install that fails, a pin the environment does not hold, torch's CUDA
against the driver) ends the host's run before anything stopped: the server, its launch files
and its environment are as they were.
"""

from __future__ import annotations

import io
import json
import posixpath
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError

if TYPE_CHECKING:
    from gpuops.plan.release import ReleaseEnv
    from gpuops.transport import Connection


@dataclass(frozen=True)
class EnvReady:
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


def _copy_wheelhouse(conn: "Connection", env: "ReleaseEnv", host: str) -> str:
    from gpuops.plan.release import wheelhouse_digest

    folder = Path(env.wheelhouse).expanduser()
    target = posixpath.join(env.envs_dir, ".wheelhouse", wheelhouse_digest(env.wheelhouse)[:16])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.name.endswith((".whl", ".tar.gz", ".zip")):
                archive.add(str(path), arcname=path.name)
    quoted, partial = shlex.quote(target), shlex.quote(target + ".partial")
    # Unpacked beside its final name and renamed once complete: a wheelhouse that is there is whole.
    command = (f"test -d {quoted} && exit 0; rm -rf {partial} && mkdir -p {partial} && tar -x -C {partial} "
               f"&& mv {partial} {quoted}")
    done = conn.run(command, stdin=buffer.getvalue(), timeout=3600)
    if not done.ok:
        raise EnvRefused(f"{host}: cannot copy the wheelhouse {env.wheelhouse} to {target}: "
                         f"{done.stderr_text().strip()[-300:]} (nothing was changed)")
    return target


def find_ready(conn: "Connection", env: "ReleaseEnv", host: str, python: str | None) -> EnvReady | None:
    """``--check``: the finished environment when the host already has it (checked), else None."""
    return _call(conn, env, host, python, {**env.payload(None), "find_only": True})


def make_ready(conn: "Connection", env: "ReleaseEnv", host: str, python: str | None) -> EnvReady:
    wheelhouse = _copy_wheelhouse(conn, env, host) if env.wheelhouse else None
    ready = _call(conn, env, host, python, env.payload(wheelhouse))
    assert ready is not None
    return ready


def _call(conn: "Connection", env: "ReleaseEnv", host: str, python: str | None,
          payload: dict[str, Any]) -> EnvReady | None:
    from gpuops.remote import python_command, python_stdin

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
