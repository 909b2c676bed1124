"""fusion-sm120 on a docker-managed server: the audit runs in the container, the patch is an image.

One lab host for the module (8 simulated RTX PRO 6000, SM120) whose SGLang server runs in a
container of a private docker daemon; the image holds a real SGLang release (0.5.8, from its PyPI
wheel) in python's dist-packages, and nothing of SGLang is installed on the host itself, so an audit
that does not look inside the container finds nothing. What runs and what the container's files
hold is read from docker itself (`docker inspect`, `docker exec`, `docker cp`), never from gpuops.
Tests run in file order and each leaves the host as it found it (the original image running).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import time
from typing import Any

import pytest
from labtools import server_info

pytestmark = pytest.mark.integration

RELEASE = "0.5.8"
COMMUNICATOR = "sglang/srt/layers/communicator.py"
SERVER_ARGS = "sglang/srt/server_args.py"


@pytest.fixture(scope="module")
def fusion_host(lab_factory, docker_daemon, debian_root):
    from gpuops.lab.docker_host import setup_docker_host, standin_image
    from gpuops.lab.sglang_cache import sglang_site

    started = time.monotonic()
    image = standin_image(docker_daemon, debian_root, sglang_site(RELEASE))
    print(f"\nlab image with sglang {RELEASE}: {time.monotonic() - started:.1f} s", flush=True)
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, server=False)
    return setup_docker_host(lab, docker_daemon, image, server_env={"NCCL_DEBUG": "WARN"})


def gpuops(run_gpuops, dh, *args: str) -> subprocess.CompletedProcess:
    return run_gpuops(*args, "-i", str(dh.lab.inventory_path), env={"XDG_STATE_HOME": ""}, timeout=600)


def report_of(proc: subprocess.CompletedProcess, name: str) -> dict[str, Any]:
    try:
        return json.loads(proc.stdout)["hosts"][name]
    except (ValueError, KeyError):
        raise AssertionError(f"no JSON report: {proc.stdout}\n{proc.stderr}") from None


def site_in_image() -> str:
    from gpuops.lab.docker_host import SITE_IN_IMAGE

    return SITE_IN_IMAGE


def file_in(dh, container: str, rel: str) -> bytes:
    """A file of SGLang as the container has it (``docker cp``, read from outside)."""
    done = dh.daemon.run("cp", f"{container}:{site_in_image()}/{rel}", "-", timeout=60)
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        member = archive.getmembers()[0]
        handle = archive.extractfile(member)
        assert handle is not None
        return handle.read()


def host_files(dh) -> dict[str, str]:
    state = dh.host.state_dir
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (state / "sglang.docker.env", state / "sglang-docker-run.sh") if p.exists()}


def served(dh, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return server_info(dh.server_port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def fusion_feature(inspect_json: dict[str, Any], host: str) -> dict[str, Any]:
    return inspect_json["hosts"][host]["features"]["flashinfer_allreduce_fusion"]


def test_inspect_audits_the_sglang_inside_the_container(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    served(dh)
    proc = gpuops(run_gpuops, dh, "inspect", "host", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entry = json.loads(proc.stdout)["hosts"][dh.host.name]
    assert entry["gates_error"] is None, gpuops(run_gpuops, dh, "inspect", "host", "-vvv").stderr[-6000:]
    software = entry["facts"]["software"]
    # The host has no SGLang at all: this version and path can only come from the container.
    assert software["sglang"]["version"] == RELEASE, software["sglang"]
    assert software["sglang"]["path"].startswith(site_in_image()), software["sglang"]
    assert "container sglang" in software["python"]["chosen_because"]
    files = {g["file"] for g in entry["gates"]}
    assert any(COMMUNICATOR.split("/", 1)[1] in f for f in files), sorted(files)[:10]
    assert fusion_feature(json.loads(proc.stdout), dh.host.name)["status"] == "blocked"
