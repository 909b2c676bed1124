"""A lab host whose SGLang server runs in a docker container (a private daemon, host network).

The host itself is an ordinary lab host (real sshd on loopback, gpuops' state dir in the lab);
its ``bin/docker`` reaches the lab's private daemon, so whatever gpuops runs there (``docker run``,
``docker inspect``) talks to that daemon only. The image is made locally, nothing is pulled:
the cached Debian root imported as a base, plus the stand-in server behind ``python3 -m
sglang.launch_server`` (``/usr/local/bin/python3`` is a wrapper that runs the stand-in for that
module and the real python for anything else) and, when given, an SGLang release's source in
python's ``dist-packages`` so that gate audits inside the container see real SGLang files.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.lab.dockerd import IMAGE_EXCLUDES, DockerDaemon, import_root, keep_image
from gpuops.lab.hosts import STANDIN_SIBLINGS
from gpuops.lab import sshd
from gpuops.lab import site as lab_site
from gpuops.lab.systemd_host import render_service_files
from gpuops.frozen import frozen

STANDIN = Path(__file__).parent / "standin_server.py"
SITE_IN_IMAGE = "/usr/local/lib/python3.11/dist-packages"
_PYTHON_WRAPPER = """#!/bin/sh
# gpuops lab image: `python3 -m sglang.launch_server FLAGS` runs the stand-in SGLang server (the
# command line still shows sglang.launch_server and FLAGS); anything else runs the real python.
if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then
  exec /usr/bin/python3 /opt/gpuops-lab/standin_server.py "$@"
fi
exec /usr/bin/python3 "$@"
"""


def base_image_tag(debian_root: Path) -> str:
    """The tag of the Debian root as an image: its cache key, the time its build finished (a root
    rebuilt under the same key, from newer packages, is a new image on a kept daemon) and what the
    import leaves out."""
    built = (debian_root / ".gpuops-root-complete").stat().st_mtime_ns
    digest = hashlib.sha256(repr((built, IMAGE_EXCLUDES)).encode()).hexdigest()
    return f"gpuops-lab/debian:{debian_root.parent.name}-{digest[:8]}"


def standin_image(daemon: DockerDaemon, debian_root: Path, sglang_site: Path | None = None,
                  stack: Mapping[str, str] | None = None) -> str:
    """Tag of the lab's SGLang image (built once per daemon, and kept across runs by a kept one:
    ``dockerd.kept_dockerd``; tagged by what went into it, its base image's id included).
    ``stack``: distributions the image holds beside the release ({dist: version}, e.g. the release's
    own pins from ``lab.site.release_stack``), as the lab's simulated version data (``lab/site.py``)."""
    base = base_image_tag(debian_root)
    base_id = import_root(daemon, debian_root, base)
    keep_image(daemon, base)
    # This module's source (the Dockerfile it writes) and lab/site.py's (the stack it simulates)
    # are inputs too: a kept image outlives edits to either.
    parts = [base_id.encode(), STANDIN.read_bytes(), _PYTHON_WRAPPER.encode(), str(sglang_site).encode(),
             Path(__file__).read_bytes(), Path(lab_site.__file__).read_bytes()]
    if stack:
        parts.append(repr(sorted(stack.items())).encode())
    digest = hashlib.sha256(b"\0".join(parts + [s.read_bytes() for s in STANDIN_SIBLINGS])).hexdigest()
    tag = f"gpuops-lab/sglang-standin:{digest[:12]}"
    if daemon.run("image", "inspect", tag, timeout=30).returncode == 0:
        keep_image(daemon, tag)
        return tag
    with tempfile.TemporaryDirectory(prefix="gpuops-image-") as context:
        ctx = Path(context)
        shutil.copyfile(STANDIN, ctx / "standin_server.py")
        for sibling in STANDIN_SIBLINGS:  # the stand-in imports its speed model from its own dir
            shutil.copyfile(sibling, ctx / sibling.name)
        (ctx / "python3").write_text(_PYTHON_WRAPPER)
        (ctx / "python3").chmod(0o755)
        lines = [f"FROM {base}", "COPY standin_server.py /opt/gpuops-lab/standin_server.py",
                 *[f"COPY {s.name} /opt/gpuops-lab/{s.name}" for s in STANDIN_SIBLINGS],
                 "COPY python3 /usr/local/bin/python3"]
        if sglang_site is not None:
            shutil.copytree(sglang_site, ctx / "site", symlinks=False)
            lines.append(f"COPY site/ {SITE_IN_IMAGE}/")
        if stack:
            lab_site.build_site(ctx / "stack", None, dict(stack))
            lines.append(f"COPY stack/ {SITE_IN_IMAGE}/")
        (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
        done = subprocess.run(daemon.cli("build", "-q", "-t", tag, str(ctx)), capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL, env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"})
        if done.returncode != 0:
            raise GpuopsError(f"lab: docker build of {tag} failed: {done.stderr.strip()[-500:]}")
    keep_image(daemon, tag)  # after the build: a build cut short leaves no mark, and no kept image
    return tag


@frozen
class DockerLabHost:
    lab: Any              # gpuops.lab.hosts.Lab (one host)
    daemon: DockerDaemon
    image: str
    server_port: int
    host_vars: Mapping[str, Any]

    @property
    def host(self) -> Any:
        return self.lab.hosts[0]

    @property
    def container(self) -> str:
        return str(self.host_vars["sglang_service"])

    def inspect(self) -> dict[str, Any]:
        import json

        done = self.daemon.run("inspect", "--type", "container", self.container, timeout=30)
        if done.returncode != 0:
            raise GpuopsError(f"lab: docker inspect {self.container}: {done.stderr.decode(errors='replace').strip()}")
        return json.loads(done.stdout)[0]


def docker_wrapper_text(daemon: DockerDaemon) -> str:
    return (
        "#!/bin/sh\n# gpuops lab: docker on this host is the lab's private daemon.\n"
        f"DOCKER_HOST='{daemon.host}'; export DOCKER_HOST\n"
        f"exec '{daemon.cli_path}' \"$@\"\n"
    )


def setup_docker_host(lab: Any, daemon: DockerDaemon, image: str, server_args: Sequence[str] = (),
                      server_env: Mapping[str, str] | None = None, container: str = "sglang") -> DockerLabHost:
    """Turn the (only) host of ``lab`` into a docker-run SGLang host; start its container."""

    host = lab.hosts[0]
    wrapper = host.bin_dir / "docker"
    wrapper.write_text(docker_wrapper_text(daemon))
    wrapper.chmod(0o755)
    port = sshd.free_port()
    host_vars: dict[str, Any] = {
        "gpuops_state_dir": str(host.state_dir), "gpuops_stop_grace": 5, "gpuops_health_timeout": 60,
        "sglang_manager": "docker", "sglang_service": container, "sglang_docker_image": image,
        "sglang_docker_options": ["--network=host"],
        "sglang_args": ["--model-path", "/models/stand-in", "--tp", "1", *server_args],
        "sglang_port": port, "sglang_env": dict(server_env or {}),
    }
    for path, text in render_service_files(host_vars).items():
        target = Path(path)
        target.write_text(text)
        target.chmod(0o600 if path.endswith(".env") else 0o755)
    _add_inventory_vars(lab.inventory_path, host.name, host_vars)
    done = subprocess.run(["/bin/sh", str(host.state_dir / "sglang-docker-run.sh")], capture_output=True, text=True,
                          env={"PATH": f"{host.bin_dir}:/usr/bin:/bin"}, timeout=120, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise GpuopsError(f"lab: starting the container failed: {done.stderr.strip()}")
    return DockerLabHost(lab=lab, daemon=daemon, image=image, server_port=port, host_vars=host_vars)


def _add_inventory_vars(inventory: Path, host: str, extra: Mapping[str, Any]) -> None:
    import yaml

    data = yaml.safe_load(inventory.read_text())
    for group in data["all"]["children"].values():
        hosts = group.get("hosts") or {}
        if host in hosts:
            hosts[host] = {**(hosts[host] or {}), **dict(extra)}
    inventory.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
