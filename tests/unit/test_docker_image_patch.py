"""fusion-sm120 on a docker-managed server, the pure parts: the plan (a derived image, never host
files), the composed launch that names it, the payload the helper builds it from, and the sh that
points the gate scan at the container's python. The real build, recreate and rollback run against a
real docker daemon in tests/integration/managers/test_docker_fusion.py."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from labtools import release_scan

from gpuops.errors import GpuopsError
from gpuops.facts.container_python import ContainerTarget, container_python_sh, docker_target, parse_container
from gpuops.gather import ProbeOutput
from gpuops.desired_state import composed, render_desired
from gpuops.plan.compose import with_contribution
from gpuops.plan.image_patch import patch_hash, path_in_image, repository_for
from gpuops.plan.model import FileState, PlanFacts

STATE = "/var/lib/gpuops"
IMAGE = "registry.example/sglang:v0.5.8"
BASE_ID = "sha256:" + "b" * 64
VARS = {"sglang_manager": "docker", "sglang_service": "sglang", "sglang_docker_image": IMAGE,
        "gpuops_state_dir": STATE, "sglang_args": ["--model-path", "/m", "--tp", "8"], "sglang_port": 30000}


def test_composed_launch_names_the_latest_image_and_old_records_stay_equal() -> None:
    old = {"nccl-env": {"args": [], "env": {"NCCL_ALGO": "Ring"}, "run_id": "r1"}}
    # A record written before images existed compares equal to the same part with no image.
    assert with_contribution(old, "nccl-env", [], {"NCCL_ALGO": "Ring"}, "r2") == old
    mine = with_contribution(old, "fusion-sm120", ["--enable-x"], {}, "r3", "gpuops/sglang:abc", IMAGE)
    assert mine["fusion-sm120"] == {"args": ["--enable-x"], "env": {}, "image": "gpuops/sglang:abc",
                                    "image_base": IMAGE, "run_id": "r3"}
    assert composed(mine)["image"] == "gpuops/sglang:abc" and composed(mine)["image_base"] == IMAGE
    assert composed(old)["image"] == ""
    # The same part again keeps its record (and run id): a rerun changes nothing.
    assert with_contribution(mine, "fusion-sm120", ["--enable-x"], {}, "r4", "gpuops/sglang:abc", IMAGE) == mine


def test_tag_is_the_patch_hash_and_a_docker_repository_name() -> None:
    files = [("/site/sglang/a.py", "x = 1\n")]
    assert patch_hash(BASE_ID, files) == patch_hash(BASE_ID, list(files))
    assert patch_hash(BASE_ID, files) != patch_hash("sha256:" + "c" * 64, files)
    assert patch_hash(BASE_ID, files) != patch_hash(BASE_ID, [("/site/sglang/a.py", "x = 2\n")])
    assert repository_for("SGLang_Main.1") == "gpuops/sglang_main.1"
    assert repository_for("a b/c") == "gpuops/a-b-c" and repository_for("--") == "gpuops/sglang"
    assert path_in_image("gpuops/s:1", "gpuops/s:1:/usr/x.py") == "/usr/x.py"


def test_only_docker_hosts_get_a_container_target() -> None:
    assert docker_target({"sglang_manager": "systemd"}) is None and docker_target({}) is None
    target = docker_target({"sglang_manager": "docker", "sglang_python": "/host/venv/bin/python"})
    assert target == ContainerTarget(container="sglang", image=None, python="python3")  # the host's python is not the container's


def fake_docker(tmp_path: Path) -> dict[str, str]:
    """A ``docker`` that says how it was called (argv one a line, then its stdin)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = inspect ]; then cat "$GPUOPS_TEST_STATE" 2>/dev/null || exit 1; exit 0; fi\n'
        'for a in "$@"; do printf "arg:%s\\n" "$a"; done\ncat\n')
    (bin_dir / "docker").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "GPUOPS_TEST_STATE": str(tmp_path / "state")}


@pytest.mark.parametrize("running, expected", [
    ("true sha256:1", ["exec", "-i", "it's $(id) `x`", "python3", "-", "{\"a\": 1}"]),
    ("false sha256:1", ["run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", "sha256:1", "-",
                        "{\"a\": 1}"]),
])
def test_the_scan_reaches_the_container_python_with_its_stdin(tmp_path: Path, running: str, expected: list[str]) -> None:
    env = fake_docker(tmp_path)
    (tmp_path / "state").write_text(running + "\n")
    target = ContainerTarget(container="it's $(id) `x`")
    # The probe's own text, as the gate scan writes it: the function is found through $GPUOPS_PY.
    script = container_python_sh(target) + "\n" + "\"$GPUOPS_PY\" - '{\"a\": 1}' <<'EOF'\nprint('scanner')\nEOF\n"
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line[4:] for line in lines if line.startswith("arg:")] == expected
    assert lines[-1] == "print('scanner')"


def test_no_container_and_no_image_is_one_clear_line(tmp_path: Path) -> None:
    env = fake_docker(tmp_path)
    script = container_python_sh(ContainerTarget(container="sglang")) + '\n"$GPUOPS_PY" - </dev/null'
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 3 and "no container sglang" in done.stderr and done.stdout == ""


def test_parse_container() -> None:
    container = [{"Id": "c1", "Name": "/sglang", "Image": BASE_ID, "Config": {"Image": IMAGE}, "State": {"Running": True}}]
    image = [{"Id": BASE_ID, "Config": {"Labels": {"gpuops.patch": "ab"}}}]
    out = ProbeOutput(stdout=json.dumps(container) + "\n" + json.dumps(image) + "\n", stderr="", exit_status=0)
    assert parse_container(out) == {"name": "sglang", "id": "c1", "image": IMAGE, "image_id": BASE_ID,
                                    "running": True, "labels": {"gpuops.patch": "ab"}}
    assert parse_container(ProbeOutput(stdout="null\n", stderr="", exit_status=0)) is None


# ---- the plan, against a real SGLang release's scan


@pytest.fixture(scope="module")
def scan_058():
    scan = release_scan("0.5.8", with_sources=True)
    assert scan.known, scan.reason
    return scan


def facts_for(scan, container):
    from gpuops.plan.planner import discover

    paths = discover("fusion-sm120", "h", VARS, {}).paths
    files = {p: FileState(path=p, exists=False) for p in paths}
    gpu = {"compute_capability": "12.0", "cuda": "12.8", "gpu_count": 8, "nvlink": False, "p2p_all_pairs": True,
           "p2p_failed_pairs": []}
    return PlanFacts(host="h", files=files, gate_scan=scan, gpu=gpu, container=container)


def running(image: str = IMAGE, labels: dict | None = None) -> dict:
    return {"name": "sglang", "id": "c1", "image": image, "image_id": BASE_ID, "running": True, "labels": labels or {}}


def test_docker_plan_patches_an_image_never_a_host_file(scan_058) -> None:
    from gpuops.apply.payload import apply_payload
    from gpuops.plan.planner import discover, plan_role

    assert discover("fusion-sm120", "h", VARS, {}).container == ContainerTarget("sglang", IMAGE)
    plan = plan_role("fusion-sm120", facts_for(scan_058, running()), VARS, {}, run_id="r1")
    image = [c for c in plan.changes if c.kind == "image"]
    host = [c for c in plan.changes if c.kind != "image"]
    assert image and plan.image is not None and plan.compile_checks == ()
    tag = plan.image.tag
    assert tag.startswith("gpuops/sglang:") and plan.image.base == BASE_ID and plan.image.base_ref == IMAGE
    assert all(c.path.startswith(tag + ":" + os.path.dirname(scan_058.root)) for c in image)
    assert {c.path.rsplit("/", 1)[1] for c in host} == {"desired.json", "sglang-docker-run.sh", "sglang.docker.env"}
    run_script = next(c for c in host if c.path.endswith("sglang-docker-run.sh")).after
    assert f" {tag} python3 -m sglang.launch_server" in run_script and IMAGE not in run_script
    assert "--enable-flashinfer-allreduce-fusion" in run_script
    desired = json.loads(next(c for c in host if c.path.endswith("desired.json")).after)
    assert desired["contributions"]["fusion-sm120"]["image"] == tag
    payload = apply_payload(plan, "r1", "d", "audit sh")
    assert {c["path"] for c in payload["changes"]} == {c.path for c in host}  # the helper writes host files only
    built = payload["image"]
    assert built["tag"] == tag and built["labels"] == {"gpuops.patch": plan.image.patch_sha256, "gpuops.base-ref": IMAGE}
    first = next(c for c in image if c.path.endswith("communicator.py"))
    entry = next(f for f in built["files"] if f["path"].endswith("communicator.py"))
    assert entry["path"] == path_in_image(tag, first.path) and entry["before_sha256"] == first.before_sha256
    assert base64.b64decode(entry["after_b64"]).decode() == first.after


def test_the_same_patch_on_the_same_image_is_the_same_tag(scan_058) -> None:
    # What makes a rerun (or the recreate after someone replaced the container) reuse the image.
    from gpuops.plan.planner import plan_role

    first = plan_role("fusion-sm120", facts_for(scan_058, running()), VARS, {}, run_id="r1")
    second = plan_role("fusion-sm120", facts_for(scan_058, running()), VARS, {}, run_id="r2")
    assert first.image.tag == second.image.tag
    other = dict(running(), image_id="sha256:" + "c" * 64)
    assert plan_role("fusion-sm120", facts_for(scan_058, other), VARS, {}, run_id="r3").image.tag != first.image.tag


@pytest.mark.parametrize("container, words", [
    (None, "no docker container"),
    (running("someone/else:1"), "runs image someone/else:1, not sglang_docker_image"),
])
def test_a_container_gpuops_cannot_base_the_patch_on_is_refused(scan_058, container, words) -> None:
    from gpuops.plan.planner import plan_role

    with pytest.raises(GpuopsError, match=words):
        plan_role("fusion-sm120", facts_for(scan_058, container), VARS, {}, run_id="r1")


def test_desired_state_with_an_image_renders_as_json() -> None:
    text = render_desired(with_contribution({}, "fusion-sm120", [], {}, "r", "gpuops/s:1", IMAGE))
    assert json.loads(text)["contributions"]["fusion-sm120"]["image_base"] == IMAGE


def test_an_upgraded_inventory_image_is_said_to_run_without_the_patch(scan_058) -> None:
    # The derived image patches v0.5.8; the inventory now names another image: the launch takes the
    # new one (unpatched), and the plan says so instead of losing the patch silently.
    from gpuops.plan.planner import plan_role

    first = plan_role("fusion-sm120", facts_for(scan_058, running()), VARS, {}, run_id="r1")
    after = {c.path: c.after for c in first.changes if c.kind != "image"}
    base = facts_for(scan_058, running())
    files = {p: FileState(path=p, exists=True, content=after[p]) if p in after else s for p, s in base.files.items()}
    facts = PlanFacts(host="h", files=files)
    upgraded = dict(VARS, sglang_docker_image="registry.example/sglang:v0.5.9")
    plan = plan_role("sglang-service", facts, upgraded, {}, run_id="r2")
    assert any("without that patch" in w and first.image.tag in w for w in plan.warnings), plan.warnings
    script = next(c.after for c in plan.changes if c.path.endswith("sglang-docker-run.sh"))
    assert "registry.example/sglang:v0.5.9" in script and first.image.tag not in script
    same = plan_role("sglang-service", facts, VARS, {}, run_id="r3")
    assert not any("without that patch" in w for w in same.warnings)
    assert all(c.action == "mode" for c in same.changes)  # the fixture has no modes; the contents stand


def test_the_images_still_in_effect_are_named_by_the_launch_desired_state_and_undoable_backups(tmp_path: Path) -> None:
    # What prune_derived_images keeps (the docker side is tested against a real daemon in
    # test_docker_fusion.py): the launch script, desired.json, and the backups of each run a
    # rollback could still write back. Not a plain rollback's backups (nothing undoes it), not an
    # undone run's, not a run's working files, not a run whose backups were pruned.
    from gpuops.remote.container_image import _names_in_effect

    def run(run_id: str, files: dict[str, str], *events: dict) -> None:
        for name, text in files.items():
            (tmp_path / "runs" / run_id / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "runs" / run_id / name).write_text(text)
        with open(tmp_path / "journal.jsonl", "a") as journal:
            for event in events:
                journal.write(json.dumps({"run_id": run_id, "time": "t", **event}) + "\n")

    changes = [{"path": f"{STATE}/sglang-docker-run.sh"}]
    script = tmp_path / "sglang-docker-run.sh"
    script.write_text("exec docker run gpuops/sglang:launch\n")
    (tmp_path / "desired.json").write_text('{"fusion-sm120": {"image": "gpuops/sglang:desired"}}')
    run("a", {"files/000": "gpuops/sglang:undone"}, {"event": "started", "changes": changes}, {"event": "finished"})
    run("b", {"files/000": "gpuops/sglang:standing", "audit.sh": "gpuops/sglang:audit"},
        {"event": "started", "changes": changes}, {"event": "finished"})
    run("c", {"files/000": "gpuops/sglang:found-by-rollback"},
        {"event": "started", "kind": "rollback", "target": "a", "changes": changes},
        {"event": "finished", "kind": "rollback", "target": "a"})
    run("d", {}, {"event": "started", "changes": changes}, {"event": "rolled_back"})

    def named() -> set[str]:
        text = b"\n".join(_names_in_effect(str(tmp_path), str(script))).decode()
        return {word.split(":")[1].strip('"}') for word in text.split() if "gpuops/sglang:" in word}

    assert named() == {"launch", "desired", "standing"}
    import shutil

    shutil.rmtree(tmp_path / "runs" / "b")  # gpuops_keep_runs pruned b: nothing can write its backups back
    assert named() == {"launch", "desired"}
