"""The image of an SGLang release on a docker host, made ready before the switch (client side).

``gpuops apply sglang-release`` on a docker server runs this between the plan and the transaction:
the image is looked up on the host (``docker image inspect``) and pulled when it is not there, its
progress on stderr as it comes (the old container serves on meanwhile), then checked from inside
(``docker run --rm --network none``, the run script's python): it must hold ``sglang==X`` and the
release's own pins, with torch's CUDA no newer than the driver's. A refusal here ends the host's
run before anything stopped; nothing here removes or changes an image or a container.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from typing import TYPE_CHECKING, Callable

from gpuops.apply.release_env import EnvRefused
from gpuops.remote.release_env import PROBE
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.plan.release import ReleaseImage
    from gpuops.transport import Connection

_PULL_TIMEOUT_S = 3600
_PULL_DONE = "gpuops-pull-exit="


@frozen
class ImageReady:
    """A release's docker image ready on the host (found or pulled, then checked from inside): its id, the pins
    it holds, and torch's CUDA against the driver's."""

    tag: str
    image_id: str
    pulled: bool
    installed: dict[str, str | None]
    torch_cuda: str | None
    driver_cuda: str | None
    pull_tail: tuple[str, ...] = ()

    def note(self, version: str) -> str:
        how = "pulled" if self.pulled else "found on the host"
        cuda = f"; torch CUDA {self.torch_cuda} (driver {self.driver_cuda or 'unknown'})" if self.torch_cuda else ""
        pins = ", ".join(f"{k} {v}" for k, v in sorted(self.installed.items()))
        return f"SGLang {version}: image {self.tag} ({self.image_id[:19]}) {how} ({pins}){cuda}"


def _image_id(conn: "Connection", tag: str) -> str | None:
    done = conn.run(f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(tag)}", timeout=60)
    text = done.stdout_text().strip()
    return text if done.ok and text.startswith("sha256:") else None


def _stderr_progress(host: str) -> Callable[[str], None]:
    def show(line: str) -> None:
        sys.stderr.write(f"{host}: {line}\n")  # the guarded stream shows host text as escapes
        sys.stderr.flush()
    return show


def pull(conn: "Connection", image: "ReleaseImage", host: str,
         progress: Callable[[str], None] | None = None) -> tuple[str, ...]:
    """``docker pull TAG`` on the host, each line of its output shown as it comes; its last lines."""
    show = progress or _stderr_progress(host)
    stream = conn.open_stream(f"docker pull {shlex.quote(image.tag)} 2>&1; echo {_PULL_DONE}$?")
    tail: list[str] = []
    status = None
    try:
        deadline = time.monotonic() + _PULL_TIMEOUT_S
        while time.monotonic() < deadline:
            raw = stream.readline(timeout=max(1.0, deadline - time.monotonic()))
            if raw is None or raw == b"":
                break
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith(_PULL_DONE):
                status = line[len(_PULL_DONE):].strip()
                break
            tail = (tail + [line])[-5:]
            show(f"docker pull {image.tag}: {line}")
    finally:
        stream.close()
    if status != "0":
        why = tail[-1] if tail else (stream.stderr_text().strip()[-300:] or "no answer")
        raise EnvRefused(f"{host}: SGLang {image.version}: docker pull {image.tag} failed: {why} -- refused before "
                         "the server stopped, nothing was changed")
    return tuple(tail)


def _driver_cuda(conn: "Connection") -> str | None:
    done = conn.run("nvidia-smi 2>/dev/null", timeout=60)
    found = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", done.stdout_text())
    return found.group(1) if found else None


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def _public(version: str | None) -> str:
    return (version or "").split("+", 1)[0]


def check_inside(conn: "Connection", image: "ReleaseImage", host: str) -> tuple[dict[str, str | None], str | None, str | None]:
    """What the image holds (its distributions, torch's CUDA), refused unless it is the release."""

    expect = dict(image.expect)
    command = (f"docker run --rm -i --network none --entrypoint {shlex.quote(image.python)} {shlex.quote(image.tag)} "
               f"- {shlex.quote(json.dumps(sorted(expect)))}")
    done = conn.run(command, stdin=PROBE.encode(), timeout=300)
    try:
        found = json.loads(done.stdout_text().strip().splitlines()[-1])
        versions = {str(k): (str(v) if v is not None else None) for k, v in dict(found["versions"]).items()}
    except (ValueError, IndexError, KeyError, TypeError):
        raise EnvRefused(f"{host}: SGLang {image.version}: cannot read what the image {image.tag} holds "
                         f"({image.python} in it, exit {done.exit_status}: {done.stderr_text().strip()[-300:]}) -- "
                         "refused before the server stopped, nothing was changed") from None
    wrong = [f"{name} {versions.get(name) or 'missing'}" + (f", not {want}" if name == "sglang" else f" (the release pins {want})")
             for name, want in sorted(expect.items(), key=lambda kv: kv[0] != "sglang")
             if _public(versions.get(name)) != _public(want)]
    if wrong:
        raise EnvRefused(f"{host}: SGLang {image.version}: the image {image.tag} does not hold the release: "
                         f"{', '.join(wrong)} -- refused before the server stopped, nothing was changed")
    torch_cuda = found.get("torch_cuda") if isinstance(found.get("torch_cuda"), str) else None
    driver = _driver_cuda(conn)
    if torch_cuda and driver and _numbers(torch_cuda) > _numbers(driver):
        raise EnvRefused(f"{host}: SGLang {image.version}: torch {versions.get('torch')} in {image.tag} is built for "
                         f"CUDA {torch_cuda}, but this host's driver runs CUDA {driver} at most -- refused before the "
                         "server stopped, nothing was changed")
    return versions, torch_cuda, driver


def make_ready(conn: "Connection", image: "ReleaseImage", host: str, pull_missing: bool = True) -> ImageReady | None:
    """The image on the host (pulled when missing, unless ``pull_missing`` is False: ``--check``,
    which then answers None) and checked from inside."""
    pulled = False
    tail: tuple[str, ...] = ()
    image_id = _image_id(conn, image.tag)
    if image_id is None:
        if not pull_missing:
            return None
        tail = pull(conn, image, host)
        pulled = True
        image_id = _image_id(conn, image.tag)
        if image_id is None:
            raise EnvRefused(f"{host}: SGLang {image.version}: docker pull {image.tag} said it finished, but the host "
                             "has no such image -- refused before the server stopped, nothing was changed")
    versions, torch_cuda, driver = check_inside(conn, image, host)
    return ImageReady(image.tag, image_id, pulled, versions, torch_cuda, driver, tuple(tail))
