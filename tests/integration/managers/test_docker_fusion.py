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
import yaml
from labtools import wait_server_info

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
    dh = setup_docker_host(lab, docker_daemon, image, server_env={"NCCL_DEBUG": "WARN"})
    # The image carries 0.5.8's FlashInfer 0.6.1 as metadata only, which the kernel rule refuses
    # (tests/integration/test_kernel_gates_lab.py and test_fusion_applicability.py test that
    # refusal); this module is about the patch as an image, so the host allows it, as an operator
    # would with the documented override.
    data = yaml.safe_load(lab.inventory_path.read_text())
    for group in data["all"]["children"].values():
        if dh.host.name in (group.get("hosts") or {}):
            group["hosts"][dh.host.name]["fusion_allow_without_kernel"] = True
    lab.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    yield dh
    docker_daemon.run("rm", "-f", dh.container, timeout=120)  # the daemon is the session's


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
    return wait_server_info(dh.server_port, timeout)


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
    text = gpuops(run_gpuops, dh, "inspect", "host").stdout
    print("\n" + text, flush=True)
    assert f"capability gates in sglang {RELEASE}" in text and "BLOCKED  flashinfer_allreduce_fusion" in text


def test_inspect_of_a_stopped_container_audits_its_image(fusion_host, run_gpuops) -> None:
    # No container runs: the audit reads the stopped container's own image (docker run --rm,
    # no network), still not the host.
    dh = fusion_host
    assert dh.daemon.run("stop", "-t", "5", dh.container, timeout=60).returncode == 0
    try:
        proc = gpuops(run_gpuops, dh, "inspect", "host", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        entry = json.loads(proc.stdout)["hosts"][dh.host.name]
        assert entry["gates_error"] is None, entry["gates_error"]
        assert entry["facts"]["software"]["sglang"]["version"] == RELEASE
        assert fusion_feature(json.loads(proc.stdout), dh.host.name)["status"] == "blocked"
        assert dh.daemon.run("ps", "-a", "--format", "{{.Names}}").stdout.decode().split() == [dh.container]
    finally:
        assert dh.daemon.run("start", dh.container, timeout=60).returncode == 0
    served(dh)


ORIGINAL: dict[str, Any] = {}  # what the host ran before the first apply (set by the check test)


def images(dh, repository: str = "gpuops/*") -> list[str]:
    done = dh.daemon.run("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference={repository}")
    return sorted(done.stdout.decode().split())


def progress_events(dh, event: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted((dh.host.state_dir / "calls").glob("*/progress.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == event:
                found.append(record)
    return found


def test_check_shows_the_image_patch_and_changes_nothing(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    before = dh.inspect()
    ORIGINAL.update(id=before["Id"], image=before["Image"], ref=before["Config"]["Image"], files=host_files(dh),
                    communicator=file_in(dh, dh.container, COMMUNICATOR), server_args=file_in(dh, dh.container, SERVER_ARGS))
    proc = gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--check", "--diff", "--json")
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 0 and report["status"] == "checked", proc.stdout + proc.stderr
    patched = [c for c in report["changes"] if c["kind"] == "image"]
    assert patched and all(c["path"].startswith("gpuops/sglang:") for c in patched), report["changes"]
    assert any(c["path"].endswith(f"{site_in_image()}/{COMMUNICATOR}") for c in patched)
    assert any("is_sm120_supported" in c["diff"] for c in patched)
    launch = [c for c in report["changes"] if c["path"].endswith("sglang-docker-run.sh")]
    assert launch and "--enable-flashinfer-allreduce-fusion" in launch[0]["diff"]
    assert patched[0]["path"].split(":/", 1)[0] in launch[0]["diff"]  # the launch names the derived image
    # Nothing happened: same container, same files, no image built.
    assert dh.inspect()["Id"] == before["Id"] and host_files(dh) == ORIGINAL["files"] and images(dh) == []


def test_apply_builds_a_derived_image_that_survives_a_recreate(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    started = time.monotonic()
    proc = gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json")
    wall = time.monotonic() - started
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    assert any("open" in n and "sm120" in n for n in report["notes"] if n.startswith("gate re-audit")), report["notes"]
    built = progress_events(dh, "image_built")
    assert built and built[-1]["built"], built
    tag = built[-1]["tag"]
    print(f"\napply fusion-sm120 on docker: {wall:.1f} s wall, derived image {tag} built in {built[-1]['seconds']} s",
          flush=True)
    info = dh.inspect()
    assert info["Config"]["Image"] == tag and info["Image"] != ORIGINAL["image"] and info["State"]["Running"]
    assert "--enable-flashinfer-allreduce-fusion" in info["Config"]["Cmd"]
    assert report["pid"] == info["State"]["Pid"]
    containers = dh.daemon.run("ps", "-a", "--format", "{{.Names}}").stdout.decode().split()
    assert containers == [dh.container]  # the build's container is gone
    labels = json.loads(dh.daemon.run("image", "inspect", "-f", "{{json .Config.Labels}}", tag).stdout)
    assert labels["gpuops.base-ref"] == ORIGINAL["ref"] and tag.endswith(":" + labels["gpuops.patch"][:12])
    patched = file_in(dh, dh.container, COMMUNICATOR)
    assert patched != ORIGINAL["communicator"] and b"is_sm120_supported" in patched
    # The way gpuops (or an operator) restarts a container: remove it, run the script again.
    assert dh.daemon.run("rm", "-f", dh.container).returncode == 0
    rerun = subprocess.run(["/bin/sh", str(dh.host.state_dir / "sglang-docker-run.sh")], capture_output=True, text=True,
                           env={"PATH": f"{dh.host.bin_dir}:/usr/bin:/bin"}, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert dh.inspect()["Id"] != info["Id"]
    assert file_in(dh, dh.container, COMMUNICATOR) == patched
    served(dh)


def test_inspect_after_apply_audits_the_patched_container(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    proc = gpuops(run_gpuops, dh, "inspect", "host", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    entry = data["hosts"][dh.host.name]
    assert entry["facts"]["software"]["sglang"]["path"].startswith(site_in_image())
    # SGLang's gates in the patched image admit sm120 now; the feature still counts as blocked because
    # the lab image carries no FlashInfer at all, and the verdict reads the kernel library too (issue 25).
    feature = fusion_feature(data, dh.host.name)
    assert feature["status"] == "blocked", feature
    assert "SGLang's own gates admit it" in feature["reason"] and "FlashInfer is not installed" in feature["reason"], feature
    assert entry["facts"]["server"]["docker"]["image"].startswith("gpuops/sglang:")


def test_rerun_changes_nothing_and_keeps_the_container(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    before, files_before, tags = dh.inspect(), host_files(dh), images(dh)
    proc = gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json")
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 0 and report["changed"] == 0 and report["status"] == "unchanged", proc.stdout + proc.stderr
    assert dh.inspect()["Id"] == before["Id"] and host_files(dh) == files_before and images(dh) == tags


def test_a_container_recreated_from_the_original_image_is_seen_and_patched_again(fusion_host, run_gpuops) -> None:
    # Someone recreates the container by hand from the original image (the patch is not in it):
    # inspect says the fusion is blocked in what runs, and the next apply recreates it from the
    # derived image again (the same patch, the same tag: reused, not rebuilt).
    dh = fusion_host
    derived = dh.inspect()["Config"]["Image"]
    script = (dh.host.state_dir / "sglang-docker-run.sh").read_text().replace(f" {derived} ", f" {ORIGINAL['ref']} ")
    assert dh.daemon.run("rm", "-f", dh.container).returncode == 0
    by_hand = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                             env={"PATH": f"{dh.host.bin_dir}:/usr/bin:/bin"}, timeout=120)
    assert by_hand.returncode == 0, by_hand.stderr
    assert dh.inspect()["Image"] == ORIGINAL["image"]
    served(dh)
    seen = gpuops(run_gpuops, dh, "inspect", "host", "--json")
    assert fusion_feature(json.loads(seen.stdout), dh.host.name)["status"] == "blocked", seen.stdout[-2000:]
    files_before, built_before = host_files(dh), len(progress_events(dh, "image_built"))
    proc = gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json")
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 0 and report["status"] == "finished" and report["changed"] > 0, proc.stdout + proc.stderr
    assert {c["kind"] for c in report["changes"]} == {"image"}  # the host's files already name the image
    assert host_files(dh) == files_before
    info = dh.inspect()
    assert info["Config"]["Image"] == derived and info["State"]["Running"]
    events = progress_events(dh, "image_built")
    assert len(events) == built_before + 1 and events[-1]["built"] is False and events[-1]["tag"] == derived
    assert b"is_sm120_supported" in file_in(dh, dh.container, COMMUNICATOR)


def test_nccl_env_after_fusion_keeps_the_derived_image(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    image = dh.inspect()["Config"]["Image"]
    proc = gpuops(run_gpuops, dh, "apply", "nccl-env", "--json", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 8}}')
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    info = dh.inspect()
    assert info["Config"]["Image"] == image and "NCCL_MIN_NCHANNELS=8" in info["Config"]["Env"]
    back = gpuops(run_gpuops, dh, "rollback")
    assert back.returncode == 0, back.stdout + back.stderr
    assert dh.inspect()["Config"]["Image"] == image
    assert images(dh) == [image]  # the fusion run still stands and names it: kept


def test_rollback_returns_to_the_original_image_byte_for_byte(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    derived = dh.inspect()["Config"]["Image"]
    back = gpuops(run_gpuops, dh, "rollback")
    assert back.returncode == 0, back.stdout + back.stderr
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and info["Config"]["Image"] == ORIGINAL["ref"] and info["State"]["Running"]
    assert "--enable-flashinfer-allreduce-fusion" not in info["Config"]["Cmd"]
    assert host_files(dh) == ORIGINAL["files"]
    assert file_in(dh, dh.container, COMMUNICATOR) == ORIGINAL["communicator"]
    assert file_in(dh, dh.container, SERVER_ARGS) == ORIGINAL["server_args"]
    served(dh)
    # No run still in effect names the derived image, and no container uses it: the rollback removed it.
    assert images(dh) == []
    assert f"removed the derived image {derived}: no run still in effect names it" in back.stdout + back.stderr
    assert [e["tag"] for e in progress_events(dh, "image_removed")][-1] == derived


def test_a_derived_image_a_container_uses_is_never_removed(fusion_host, run_gpuops, monkeypatch) -> None:
    # An image no run names stays while the server's container runs it (here under a second tag,
    # which a plain `docker rmi` would just untag) or another container uses it (docker refuses
    # and gpuops never forces); it goes once nothing does.
    from types import SimpleNamespace

    from gpuops.remote.container_image import prune_derived_images

    dh = fusion_host
    env = {"PATH": f"{dh.host.bin_dir}:/usr/bin:/bin"}
    script = dh.host.state_dir / "sglang-docker-run.sh"

    def recreate_from(image: str) -> None:
        text = script.read_text().replace(f" {dh.inspect()['Config']['Image']} ", f" {image} ")
        done = subprocess.run(["/bin/sh", "-c", f"docker rm -f {dh.container} >/dev/null; {text}"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0 and dh.inspect()["Config"]["Image"] == image, done.stderr

    fusion = report_of(gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json"), dh.host.name)
    assert fusion["status"] == "finished", fusion
    derived = dh.inspect()["Config"]["Image"]
    second = derived.rsplit(":", 1)[0] + ":by-hand"
    assert dh.daemon.run("tag", derived, second).returncode == 0
    recreate_from(second)
    monkeypatch.setenv("PATH", env["PATH"] + ":" + __import__("os").environ["PATH"])
    work = dh.host.state_dir / "prune-test"
    work.mkdir(exist_ok=True)
    run = SimpleNamespace(payload={"service": {"manager": "docker", "name": dh.container, "docker_run_script": str(script)}},
                          state_dir=str(dh.host.state_dir), run_dir=str(work), progress=lambda event: None)
    notes: list[str] = []
    prune_derived_images(run, notes)
    # The fusion run names one tag, the container runs the other: both kept.
    assert images(dh) == sorted([derived, second]) and notes == []

    assert dh.daemon.run("create", "--name", "holder", second, "true").returncode == 0
    try:
        back = gpuops(run_gpuops, dh, "rollback")
        assert back.returncode == 0, back.stdout + back.stderr
        assert dh.inspect()["Image"] == ORIGINAL["image"]
        # One tag went (the image had two); the last one is the holder's image: docker refused.
        left = images(dh)
        assert len(left) == 1 and left[0] in (derived, second), left
        assert f"kept the derived image {left[0]} (docker rmi:" in back.stdout + back.stderr
    finally:
        assert dh.daemon.run("rm", "-f", "holder").returncode == 0
    prune_derived_images(run, notes)
    assert images(dh) == [] and notes[-1] == f"removed the derived image {left[0]}: no run still in effect names it"
    assert host_files(dh) == ORIGINAL["files"]
    served(dh)


def test_a_server_that_crashes_on_the_derived_image_rolls_back_to_the_original(fusion_host, run_gpuops) -> None:
    dh = fusion_host
    crash = json.dumps({"sglang_env": {"NCCL_DEBUG": "WARN",
                                       "GPUOPS_STANDIN_CRASH_IF": "enable_flashinfer_allreduce_fusion=true"}})
    proc = gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json", "-e", crash)
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
    assert "exit code 1" in report["error"], report["error"]
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and info["State"]["Running"]
    assert host_files(dh) == ORIGINAL["files"]
    assert file_in(dh, dh.container, COMMUNICATOR) == ORIGINAL["communicator"]
    assert images(dh) == []  # the image this run built went with it
    assert "GPUOPS_STANDIN_CRASH_IF" not in served(dh)["env"]


def test_patched_files_that_do_not_compile_in_the_image_roll_back_before_the_restart(fusion_host, run_gpuops) -> None:
    # Lab fault: the image's patched files get a syntax error. The compile check runs with the
    # image's own python before any container uses it: the run rolls back, the server untouched.
    dh = fusion_host
    before = dh.inspect()
    (dh.host.state_dir / "lab-fault.json").write_text(json.dumps({"corrupt_patch": True}))
    proc = gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json")
    report = report_of(proc, dh.host.name)
    assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
    assert "do not compile with python3 in image gpuops/sglang:" in report["error"], report["error"]
    assert dh.inspect()["Id"] == before["Id"] and host_files(dh) == ORIGINAL["files"] and images(dh) == []
    assert file_in(dh, dh.container, COMMUNICATOR) == ORIGINAL["communicator"]


def test_a_file_changed_inside_the_running_container_is_not_baked_over(fusion_host, run_gpuops) -> None:
    # Someone edited SGLang inside the running container (its writable layer): the plan read that
    # copy, the image holds another. Building on the image would silently drop the edit, building on
    # the container would bake in unknown bytes: the run stops before the server is touched.
    dh = fusion_host
    target = f"{site_in_image()}/{COMMUNICATOR}"
    edit = dh.daemon.run("exec", dh.container, "sh", "-c", f"printf '\\n# local edit\\n' >> {target}")
    assert edit.returncode == 0, edit.stderr
    before = dh.inspect()
    try:
        proc = gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json")
        report = report_of(proc, dh.host.name)
        assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
        assert "is not what gpuops planned from" in report["error"] and COMMUNICATOR in report["error"], report["error"]
        assert dh.inspect()["Id"] == before["Id"] and host_files(dh) == ORIGINAL["files"] and images(dh) == []
        assert file_in(dh, dh.container, COMMUNICATOR).endswith(b"# local edit\n")
    finally:  # back to a container made from the original image, as the next tests expect
        assert dh.daemon.run("rm", "-f", dh.container).returncode == 0
        again = subprocess.run(["/bin/sh", str(dh.host.state_dir / "sglang-docker-run.sh")], capture_output=True,
                               text=True, env={"PATH": f"{dh.host.bin_dir}:/usr/bin:/bin"}, timeout=120)
        assert again.returncode == 0, again.stderr
    assert file_in(dh, dh.container, COMMUNICATOR) == ORIGINAL["communicator"]
    served(dh)


def build_containers(dh) -> list[str]:
    """Containers a derived image's build left (``gpuops-build-<patch>``), running or not."""
    done = dh.daemon.run("ps", "-a", "--format", "{{.Names}}", "--filter", "name=gpuops-build-")
    return sorted(done.stdout.decode().split())


@pytest.mark.parametrize("phase", ["image_build", "audit", "health"])
def test_client_killed_mid_apply_leaves_the_original_image_running(fusion_host, gpuops_home, phase: str) -> None:
    # The transaction covers the image: gpuops dies once the launch files name the derived image
    # but before it is built (image_build), once it is built and being re-audited (audit), or after
    # the container was recreated from it (health); the host rolls itself back when the lease
    # lapses, to the original container spec, image and files, and no derived image is left.
    import signal

    from labtools import client_paused_at, rolled_back_count, wait_for_self_rollback

    dh = fusion_host
    state = dh.host.state_dir
    rolled_before = rolled_back_count(state)
    client = client_paused_at(state, phase, ["apply", "fusion-sm120", "-i", str(dh.lab.inventory_path),
                                             "-e", "gpuops_lease=4", "-e", "smoke_check=false"], gpuops_home, 300)
    try:
        running = dh.inspect()
        if phase == "image_build":
            # The launch files are written and name a tag that does not exist yet; nothing built.
            assert host_files(dh) != ORIGINAL["files"]
            assert "gpuops/sglang:" in (state / "sglang-docker-run.sh").read_text()
            assert images(dh) == [] and build_containers(dh) == []
        else:
            assert len(images(dh)) == 1  # the derived image is built
        if phase == "health":
            assert running["Config"]["Image"].startswith("gpuops/sglang:")  # recreated from the derived image
        else:
            assert running["Image"] == ORIGINAL["image"]  # not touched yet
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    wait_for_self_rollback(state / "lock", lambda: rolled_back_count(state) > rolled_before, time.monotonic() + 4 + 90)
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and info["Config"]["Image"] == ORIGINAL["ref"] and info["State"]["Running"]
    assert host_files(dh) == ORIGINAL["files"]
    assert file_in(dh, dh.container, COMMUNICATOR) == ORIGINAL["communicator"]
    assert images(dh) == []  # built by the run that was undone: removed with it (or never built)
    assert build_containers(dh) == []
    served(dh)


def test_client_killed_while_docker_commits_the_derived_image_leaves_nothing_built(fusion_host, gpuops_home) -> None:
    # gpuops dies while a docker command of the build is running (here `docker commit`, made to
    # hang by the host's docker wrapper): the host's polled runner kills that command when the lease
    # lapses, the build container is still removed, and the host rolls back to the original.
    import os
    import signal
    import sys

    from labtools import rolled_back_count, wait_for_self_rollback

    dh = fusion_host
    state = dh.host.state_dir
    wrapper = dh.host.bin_dir / "docker"
    original_wrapper = wrapper.read_text()
    marker = state.parent / "docker-commit.pid"
    head, rest = original_wrapper.split("\n", 1)
    wrapper.write_text(f"{head}\nif [ \"$1\" = commit ]; then echo $$ > '{marker}'; exec sleep 600; fi\n{rest}")
    rolled_before = rolled_back_count(state)
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "XDG_STATE_HOME")}
    env["HOME"] = str(gpuops_home)
    client = subprocess.Popen([sys.executable, "-m", "gpuops.cli", "apply", "fusion-sm120", "-i", str(dh.lab.inventory_path),
                               "-e", "gpuops_lease=4", "-e", "smoke_check=false"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 300
        while not (marker.exists() and marker.read_text().strip()):
            assert client.poll() is None, client.communicate()
            assert time.monotonic() < deadline, "docker commit never started"
            time.sleep(0.05)
        commit_pid = int(marker.read_text())
        assert build_containers(dh) and images(dh) == []  # mid-build: its container exists, no image yet
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
        wait_for_self_rollback(state / "lock", lambda: rolled_back_count(state) > rolled_before,
                               time.monotonic() + 4 + 90)
    finally:
        if client.poll() is None:
            client.kill()
        wrapper.write_text(original_wrapper)
    assert not os.path.exists(f"/proc/{commit_pid}")  # the hung docker commit was killed (and reaped)
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and info["Config"]["Image"] == ORIGINAL["ref"] and info["State"]["Running"]
    assert host_files(dh) == ORIGINAL["files"]
    assert images(dh) == [] and build_containers(dh) == []
    last = json.loads((state / "journal.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "rolled_back" and "while building image gpuops/sglang:" in last["error"], last
    served(dh)
    marker.unlink()


def test_rollback_of_the_fusion_run_under_a_later_nccl_run_returns_to_the_original_image(fusion_host, run_gpuops) -> None:
    # A later run (nccl-env) still stands: undoing the fusion run recomposes the launch without its
    # part, so the container goes back to the original image and keeps nccl-env's environment.
    dh = fusion_host
    fusion = report_of(gpuops(run_gpuops, dh, "apply", "fusion-sm120", "--json"), dh.host.name)
    assert fusion["status"] == "finished", fusion
    derived = dh.inspect()["Config"]["Image"]
    assert derived.startswith("gpuops/sglang:")
    nccl = report_of(gpuops(run_gpuops, dh, "apply", "nccl-env", "--json", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 8}}'),
                     dh.host.name)
    assert nccl["status"] == "finished" and dh.inspect()["Config"]["Image"] == derived, nccl
    back = gpuops(run_gpuops, dh, "rollback", "--run", fusion["run_id"])
    assert back.returncode == 0, back.stdout + back.stderr
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and info["Config"]["Image"] == ORIGINAL["ref"] and info["State"]["Running"]
    assert "NCCL_MIN_NCHANNELS=8" in info["Config"]["Env"]
    assert "--enable-flashinfer-allreduce-fusion" not in info["Config"]["Cmd"]
    assert file_in(dh, dh.container, COMMUNICATOR) == ORIGINAL["communicator"]
    last = gpuops(run_gpuops, dh, "rollback", "--run", nccl["run_id"])
    assert last.returncode == 0, last.stdout + last.stderr
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and "NCCL_MIN_NCHANNELS=8" not in info["Config"]["Env"]
    assert host_files(dh) == ORIGINAL["files"]
    served(dh)


NEW_RELEASE = "0.5.21"


@pytest.mark.timeout(900)  # two gate audits of real SGLang trees in containers (about 150 s on a quiet machine)
def test_sglang_release_moves_the_container_to_the_new_image_and_back(fusion_host, debian_root, run_gpuops) -> None:
    """sglang-release on a docker server: the release is an image. Refused before anything stops
    (an image that cannot be pulled, one holding another release); then switched (the container
    recreated from the new image, which holds 0.5.21 and its pins), and back with gpuops rollback
    to the original image, byte for byte."""
    from gpuops.lab.docker_host import standin_image
    from gpuops.lab.sglang_cache import sglang_site, sglang_wheel
    from gpuops.release.wheel import read_release

    dh = fusion_host
    pins = read_release(NEW_RELEASE, sglang_wheel(NEW_RELEASE)).pins  # the release's own METADATA
    new_image = standin_image(dh.daemon, debian_root, sglang_site(NEW_RELEASE), stack=pins)
    before, files_before = dh.inspect(), host_files(dh)
    assert before["Config"]["Image"] == ORIGINAL["ref"]

    def release(*args: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
        proc = gpuops(run_gpuops, dh, "apply", "sglang-release", "-e", f"sglang_version={NEW_RELEASE}", "--json", *args)
        return proc, report_of(proc, dh.host.name)

    def unchanged() -> None:
        info = dh.inspect()
        assert info["Id"] == before["Id"] and info["State"]["Running"], "the container was touched"
        assert host_files(dh) == files_before
        assert served(dh)["version"] == RELEASE

    # An image the host does not have and cannot pull (the lab's daemon reaches no registry).
    proc, report = release("-e", "sglang_release_image=gpuops-lab/no-such-sglang:v0.5.21")
    assert proc.returncode == 1 and report["status"] == "refused", proc.stdout + proc.stderr
    assert "docker pull gpuops-lab/no-such-sglang:v0.5.21 failed" in report["error"], report
    assert "docker pull gpuops-lab/no-such-sglang:v0.5.21:" in proc.stderr  # its progress, as it came
    unchanged()
    # An image holding another release than the one named.
    proc, report = release("-e", f"sglang_release_image={ORIGINAL['ref']}")
    assert proc.returncode == 1 and report["status"] == "refused", proc.stdout + proc.stderr
    assert f"does not hold the release: sglang {RELEASE}, not {NEW_RELEASE}, " in report["error"], report
    unchanged()

    # --check: the image is on the host, so it is checked inside and its gate audit shown; nothing changes.
    proc, report = release("-e", f"sglang_release_image={new_image}", "--check")
    assert proc.returncode == 0 and report["status"] == "checked", proc.stdout + proc.stderr
    assert any(f"image {new_image}" in n and "found on the host" in n for n in report["notes"]), report["notes"]
    assert any(n.startswith(f"gate audit, sglang {RELEASE} (running) -> {NEW_RELEASE}") for n in report["notes"]), report
    unchanged()

    # The switch: pulled or found, checked inside, audited, then one transaction.
    proc, report = release("-e", f"sglang_release_image={new_image}")
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    notes = "\n".join(report["notes"])
    assert f"SGLang {NEW_RELEASE}: image {new_image}" in notes and "found on the host" in notes, notes
    assert all(f"{dist} {version}" in notes for dist, version in pins.items()), notes
    assert f"gate audit, sglang {RELEASE} (running) -> {NEW_RELEASE} (new environment)" in notes, notes
    info = dh.inspect()
    assert info["Id"] != before["Id"] and info["Config"]["Image"] == new_image and info["State"]["Running"]
    assert report["pid"] == info["State"]["Pid"]
    assert served(dh)["version"] == NEW_RELEASE
    assert dh.daemon.run("image", "inspect", ORIGINAL["ref"]).returncode == 0  # the old image stays

    # Back: the container recreated from the original image, the launch files byte for byte.
    started = time.monotonic()
    back = gpuops(run_gpuops, dh, "rollback")
    took = time.monotonic() - started
    assert back.returncode == 0, back.stdout + back.stderr
    print(f"\nsglang-release on docker: rollback to {RELEASE} in {took:.1f} s", flush=True)
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and info["Config"]["Image"] == ORIGINAL["ref"] and info["State"]["Running"]
    assert host_files(dh) == ORIGINAL["files"]
    assert served(dh)["version"] == RELEASE
    assert took < 60, took


def test_client_killed_after_the_container_moved_to_the_new_image_goes_back(fusion_host, debian_root,
                                                                             gpuops_home) -> None:
    """gpuops dies after the container was recreated from the release's image (health): the lease
    lapses and the host recreates it from the original image, the launch files byte for byte."""
    import signal

    from gpuops.lab.docker_host import standin_image
    from gpuops.lab.sglang_cache import sglang_site, sglang_wheel
    from gpuops.release.wheel import read_release
    from labtools import client_paused_at, rolled_back_count, wait_for_self_rollback

    dh = fusion_host
    state = dh.host.state_dir
    pins = read_release(NEW_RELEASE, sglang_wheel(NEW_RELEASE)).pins
    new_image = standin_image(dh.daemon, debian_root, sglang_site(NEW_RELEASE), stack=pins)  # built by the test above
    rolled_before = rolled_back_count(state)
    client = client_paused_at(state, "health", ["apply", "sglang-release", "-i", str(dh.lab.inventory_path),
                                                "-e", f"sglang_version={NEW_RELEASE}", "-e", f"sglang_release_image={new_image}",
                                                "-e", "gpuops_lease=4", "-e", "smoke_check=false"], gpuops_home, 600)
    try:
        assert dh.inspect()["Config"]["Image"] == new_image  # recreated from the release's image
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    wait_for_self_rollback(state / "lock", lambda: rolled_back_count(state) > rolled_before, time.monotonic() + 4 + 90)
    info = dh.inspect()
    assert info["Image"] == ORIGINAL["image"] and info["Config"]["Image"] == ORIGINAL["ref"] and info["State"]["Running"]
    assert host_files(dh) == ORIGINAL["files"]
    assert served(dh)["version"] == RELEASE
