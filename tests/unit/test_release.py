"""An SGLang release as gpuops reads it: pins from the real wheels' METADATA, server flags from
their own argument sources, the launch checked and translated, the contribution composed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpuops.errors import GpuopsError
from gpuops.lab.sglang_cache import sglang_wheel
from gpuops.lab.wheelhouse import satisfying_version
from gpuops.desired_state import composed
from gpuops.plan.compose import with_contribution
from gpuops.release.flags import check_launch, release_flags, rename_flags
from gpuops.release.wheel import parse_requires, read_release
from gpuops.remote import release_env


@pytest.fixture(scope="module")
def releases() -> dict:
    return {v: read_release(v, sglang_wheel(v)) for v in ("0.5.8", "0.5.21")}


def test_pins_are_the_release_metadata(releases) -> None:
    assert releases["0.5.8"].pins == {"flashinfer-python": "0.6.1", "flashinfer-cubin": "0.6.1",
                                      "sgl-kernel": "0.3.21", "torch": "2.9.1"}
    assert releases["0.5.21"].pins == {"flashinfer-python": "0.6.18", "sglang-kernel": "0.4.7", "torch": "2.13.0"}
    # The extra the release asks of flashinfer travels with its pin.
    assert releases["0.5.21"].install_requirements() == [
        "sglang==0.5.21", "flashinfer-python[cu13]==0.6.18", "sglang-kernel==0.4.7", "torch==2.13.0"]


def test_flags_of_both_parser_shapes(releases) -> None:
    old = release_flags(releases["0.5.8"].sources)    # add_argument calls
    new = release_flags(releases["0.5.21"].sources)   # annotated dataclass fields (arg_groups/fields)
    assert len(old.names) > 300 and len(new.names) > 450
    for flag in ("--model-path", "--tp-size", "--speculative-num-steps", "--enable-flashinfer-allreduce-fusion"):
        assert flag in old.names and flag in new.names, flag
    assert "--flashinfer-allreduce-fusion-backend" in new.names
    assert "--flashinfer-allreduce-fusion-backend" not in old.names
    assert "--torchao-config" in old.names and "--torchao-config" not in new.names
    # Arg(no_cli=True) is not a flag (0.5.21 registers the deprecated spelling by hand instead).
    assert "--enable-flashinfer-allreduce-fusion" in new.replacements
    assert new.replacements["--enable-flashinfer-allreduce-fusion"] == ("--flashinfer-allreduce-fusion-backend=auto",)
    assert not old.replacements


def test_launch_checked_against_the_release(releases) -> None:
    new = release_flags(releases["0.5.21"].sources)
    checked = check_launch(["--model-path", "/m", "--tp", "8", "--enable-flashinfer-allreduce-fusion"], new, "0.5.21", "h")
    assert checked.renames == {"--enable-flashinfer-allreduce-fusion": ("--flashinfer-allreduce-fusion-backend=auto",)}
    assert checked.notes and "deprecated in SGLang 0.5.21" in checked.notes[0]
    with pytest.raises(GpuopsError, match="SGLang 0.5.21's server has no flag --torchao-config"):
        check_launch(["--torchao-config", "int4wo-128"], new, "0.5.21", "h")
    # argparse's unique-prefix rule: --cuda-graph-max-bs is ambiguous in 0.5.21 (-decode, -prefill).
    with pytest.raises(GpuopsError, match="--cuda-graph-max-bs"):
        check_launch(["--cuda-graph-max-bs", "8"], new, "0.5.21", "h")
    old = release_flags(releases["0.5.8"].sources)
    assert check_launch(["--cuda-graph-max-bs", "8", "--tp", "8"], old, "0.5.8", "h").renames == {}


def test_rename_flags_replaces_whole_words_only() -> None:
    renames = {"--enable-x": ["--x-backend=auto"]}
    assert rename_flags(["--enable-x", "--enable-xy", "v"], renames) == ["--x-backend=auto", "--enable-xy", "v"]


def test_release_contribution_composes() -> None:
    parts = with_contribution({}, "fusion-sm120", ["--enable-x"], {}, "r1")
    parts = with_contribution(parts, "sglang-release", [], {"PYTHONPATH": ""}, "r2", python="/e/bin/python",
                              renames={"--enable-x": ["--x-backend=auto"]})
    out = composed(parts)
    assert out["python"] == "/e/bin/python" and out["renames"] == {"--enable-x": ["--x-backend=auto"]}
    assert out["args"] == ["--enable-x"] and out["env"] == {"PYTHONPATH": ""}
    # Re-applying the same release keeps its record (and run id): a no-op.
    again = with_contribution(parts, "sglang-release", [], {"PYTHONPATH": ""}, "r3", python="/e/bin/python",
                              renames={"--enable-x": ["--x-backend=auto"]})
    assert again == parts
    assert composed(with_contribution(parts, "sglang-release", [], {}, "r4"))["python"] == ""


def test_requires_parsing_and_lab_versions() -> None:
    reqs = {r.name: r for r in parse_requires(
        "Requires-Dist: flashinfer_python[cu13]==0.6.18\nRequires-Dist: torch_memory_saver>=0.0.9.post1\n"
        "Requires-Dist: flash-attn-4>=4.0.0b18\nRequires-Dist: llguidance<2.0.0,>=1.7.6\n"
        "Requires-Dist: pytest; extra == \"test\"\nRequires-Dist: tomli; python_version < \"3.11\"\n")}
    assert "pytest" not in reqs and reqs["tomli"].marker
    assert reqs["flashinfer-python"].extras == ("cu13",) and reqs["flashinfer-python"].pinned == "0.6.18"
    assert satisfying_version(reqs["torch-memory-saver"]) == "0.0.9.post1"
    assert satisfying_version(reqs["flash-attn-4"]) == "4.0.0"
    assert satisfying_version(reqs["llguidance"]) == "1.7.6"


def _helper(payload: dict) -> dict:
    from gpuops.shipping import python_command, python_stdin

    done = subprocess.run(["/bin/sh", "-c", python_command(sys.executable)], input=python_stdin("release_env", payload),
                          capture_output=True, timeout=120)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def test_host_build_refusals_change_nothing(tmp_path: Path) -> None:
    envs = tmp_path / "envs"
    base = {"envs_dir": str(envs), "name": "sglang-9.9.9-0123456789ab", "base_python": sys.executable,
            "requirements": ["sglang==9.9.9"], "expect": {"sglang": "9.9.9"}, "wheelhouse": str(tmp_path)}
    out = _helper({**base, "min_free_bytes": 1 << 60})
    assert out["ok"] is False and out["stage"] == "disk" and "GiB free" in out["error"], out
    assert not envs.exists()
    # A build killed before its marker is not "finished": --check (find_only) says it is not there.
    (envs / base["name"] / "bin").mkdir(parents=True)
    assert _helper({**base, "find_only": True}) == {"ok": True, "found": False, "env_dir": str(envs / base["name"])}
    # Nothing to install from: the install fails, and what it made is removed (the killed build too).
    out = _helper({**base, "min_free_bytes": 0})
    assert out["ok"] is False and out["stage"] == "install", out
    assert not (envs / base["name"]).exists()
    assert os.listdir(envs) == [".lock"]
    out = _helper({**base, "name": "../x"})
    assert out["ok"] is False and out["stage"] == "input"


def test_prune_keeps_what_the_launch_and_the_runs_need(tmp_path: Path) -> None:
    envs, state = tmp_path / "envs", tmp_path / "state"
    names = [f"sglang-0.5.{n}-{n:012x}" for n in (18, 19, 20, 21, 22)]
    for i, name in enumerate(names):
        (envs / name / "bin").mkdir(parents=True)
        (envs / name / release_env.MARKER).write_text(json.dumps({"created": f"2026-12-0{i + 1}T00:00:00Z"}))
    (envs / "sglang-0.5.9-00000000000a").mkdir()  # a killed build: not finished, not counted, left alone
    state.mkdir()
    # The launch runs 0.5.18 (the oldest); a kept run's backup (its rollback) names 0.5.19.
    (state / "sglang-launch.sh").write_text(f"exec {envs / names[0]}/bin/python -m sglang.launch_server\n")
    run = state / "runs" / "r1"
    (run / "files").mkdir(parents=True)
    (run / "files" / "001").write_text(f"exec {envs / names[1]}/bin/python -m sglang.launch_server\n")
    (run / "manifest.json").write_text(json.dumps({"files": [{"path": str(state / "sglang-launch.sh"),
                                                                "backup": str(run / "files" / "001")}]}))
    removed = release_env.prune(str(envs), 1, str(state), str(envs / names[4]))
    # Left: the one just built (0.5.22), the needed 0.5.18 and 0.5.19, the newest other (0.5.21).
    assert removed == [str(envs / names[2])]
    assert sorted(os.listdir(envs)) == sorted([*names[:2], *names[3:], "sglang-0.5.9-00000000000a"])
    assert release_env.prune(str(envs), 0, str(state), str(envs / names[4])) == [str(envs / names[3])]


def test_release_tag_follows_the_running_images_repository() -> None:
    from gpuops.plan.release import release_tag

    assert release_tag("lmsysorg/sglang:latest", "0.5.21") == "lmsysorg/sglang:v0.5.21"
    assert release_tag("registry.local:5000/ml/sglang:v0.5.8-cu129", "0.5.21") == "registry.local:5000/ml/sglang:v0.5.21"
    assert release_tag("registry.local:5000/sglang", "0.5.21") == "registry.local:5000/sglang:v0.5.21"
    assert release_tag("lmsysorg/sglang@sha256:" + "0" * 64, "0.5.21") == "lmsysorg/sglang:v0.5.21"


def test_a_standing_source_patch_is_judged_on_the_new_tree() -> None:
    """fusion-sm120's patch of the running release is never carried over: the new tree's verdict for
    its feature decides (open by itself: a note; otherwise refused, naming the run and the way)."""
    from gpuops.apply.release_audit import TreeVerdicts, judge_patches
    from gpuops.plan.release import StandingPatch

    patch = (StandingPatch("fusion-sm120", "20261201-1", "flashinfer_allreduce_fusion"),)
    old = TreeVerdicts("0.5.8", {"flashinfer_allreduce_fusion": "open"}, ())
    notes, refusal = judge_patches(patch, old, TreeVerdicts("0.5.21", {"flashinfer_allreduce_fusion": "blocked"}, ()), "0.5.21")
    assert refusal is not None and notes == []
    assert "fusion-sm120 (run 20261201-1) patched SGLang 0.5.8" in refusal and "blocked" in refusal
    assert "gpuops rollback --run 20261201-1" in refusal and "nothing was changed" in refusal
    notes, refusal = judge_patches(patch, old, TreeVerdicts("0.5.23", {"flashinfer_allreduce_fusion": "open"}, ()), "0.5.23")
    assert refusal is None and "opens flashinfer_allreduce_fusion on this host by itself" in notes[0]
    # A new tree without the feature at all is not "open".
    assert judge_patches(patch, old, TreeVerdicts("0.6.0", {}, ()), "0.6.0")[1] is not None
    assert judge_patches((), old, TreeVerdicts("0.6.0", {}, ()), "0.6.0") == ([], None)


def _recorded_refusal(name: str) -> list[str]:
    text = (Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "installer-refusals" / name).read_text()
    return [line for line in text.strip().splitlines() if line.strip()]  # as release_env._run keeps them


def test_a_failed_install_says_why_in_one_line() -> None:
    """The refusal's line is the installer's reason, from what the real installers printed
    (tests/fixtures/recorded/installer-refusals): pip's last ERROR line; uv's error line with the
    cause after it (its last line may be a hint that names no package); capped, never a whole log."""
    pip = release_env._reason(_recorded_refusal("pip-23.0.1-missing-torch.txt"))
    assert pip == "ERROR: No matching distribution found for torch==2.13.0"
    for name in ("uv-0.13.8-missing-torch.txt", "uv-0.13.8-no-locations.txt"):
        said = release_env._reason(_recorded_refusal(name))
        assert said.startswith("error: No solution found") and "torch was not found" in said, said
        assert "\n" not in said and len(said) <= release_env._REASON_CHARS
    assert release_env._reason(["x" * 5000]) == "x" * release_env._REASON_CHARS
    assert release_env._reason(["Killed"]) == "Killed" and release_env._reason([]) == ""
