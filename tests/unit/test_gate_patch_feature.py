"""The gate patch is driven by the feature a role names and the catalog's entry for it, not by a
name written into the planner: another feature's gates are the ones widened, a feature without a
patch recipe and an unknown feature are one clear line before any host is reached."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from test_gate_scanner_snippets import make_site

from gpuops.errors import GpuopsError
from gpuops.gates.catalog import catalog_from_data, load_catalog
from gpuops.gates.local import scan_site
from gpuops.gates.patch import UnrecognisedLayout, patch_recipe, plan_gate_patch
from gpuops.plan.planner import discover

# A feature the built-in catalog does not know, recognised by its own function and launch flag.
DEMO = {
    "title": "demo fused kernel",
    "keywords": ["demo_kernel"],
    "flags": [{"setting": "enable_demo_kernel", "flag": "--enable-demo-kernel"}],
    "gates": [{"role": "runtime", "why": "decides whether the demo kernel runs",
               "match": {"function": ["demo_kernel_applies"]}}],
    "patch": {"widen": ["runtime"]},
}
SOURCE = """
    from sglang.srt.utils import is_sm90_supported, is_sm100_supported

    def demo_kernel_applies(n, enable_demo_kernel=False):
        return enable_demo_kernel and is_sm90_supported() and n > 0

    def apply_flashinfer_allreduce_fusion(n):
        return is_sm100_supported() and n > 0
    """


def catalog_with_demo():
    data = yaml.safe_load((Path(__file__).parents[2] / "src/gpuops/gates/catalog.yaml").read_text())
    data["features"]["demo_kernel"] = DEMO
    return catalog_from_data(data, "test catalog")


def scanned(tmp_path: Path):
    site = make_site(tmp_path, {"srt/layers/demo.py": SOURCE})
    scan = scan_site(site, with_sources=True)
    assert scan.known, scan.reason
    sources = {"srt/layers/demo.py": (site / "sglang/srt/layers/demo.py").read_text()}
    return scan, sources


def test_the_named_feature_decides_which_gates_are_widened(tmp_path: Path) -> None:
    scan, sources = scanned(tmp_path)
    catalog = catalog_with_demo()
    demo = plan_gate_patch(scan, sources, "demo_kernel", "sm120", catalog)
    assert demo.feature == "demo_kernel"
    assert [w.function for w in demo.widened] == ["demo_kernel_applies"]
    (change,) = demo.changes
    assert "return enable_demo_kernel and (is_sm90_supported() or is_sm120_supported()) and n > 0" in change.after
    assert "return is_sm100_supported() and n > 0" in change.after  # the other feature's gate: untouched
    assert demo.launch_args == ("--enable-demo-kernel",)
    fusion = plan_gate_patch(scan, sources, "flashinfer_allreduce_fusion", "sm120", catalog)
    assert fusion.feature == "flashinfer_allreduce_fusion"
    assert [w.function for w in fusion.widened] == ["apply_flashinfer_allreduce_fusion"]
    assert "return (is_sm100_supported() or is_sm120_supported()) and n > 0" in fusion.changes[0].after
    assert "return enable_demo_kernel and is_sm90_supported() and n > 0" in fusion.changes[0].after


def test_a_feature_without_its_gates_in_the_release_is_refused(tmp_path: Path) -> None:
    site = make_site(tmp_path, {"srt/layers/other.py": "def f():\n    return 1\n"})
    scan = scan_site(site, with_sources=True)
    with pytest.raises(UnrecognisedLayout, match=r"gate patch \(demo_kernel\): .*no runtime gate of demo fused kernel"):
        plan_gate_patch(scan, {}, "demo_kernel", "sm120", catalog_with_demo())


def test_only_features_with_a_patch_recipe_can_be_patched() -> None:
    assert patch_recipe("flashinfer_allreduce_fusion").needs_p2p  # the fused kernel's IPC buffers
    with pytest.raises(GpuopsError, match="feature 'deepgemm' has no patch recipe in the gate catalog "
                                          r"\(features gpuops can patch: flashinfer_allreduce_fusion\)"):
        patch_recipe("deepgemm")
    with pytest.raises(GpuopsError, match="gate catalog: no feature 'nope'"):
        patch_recipe("nope")
    assert [f.name for f in load_catalog().features if f.patchable] == ["flashinfer_allreduce_fusion"]


def role_with_feature(tmp_path: Path, feature: str) -> Path:
    role = tmp_path / "roles" / "open-feature"
    role.mkdir(parents=True)
    (role / "tasks.yml").write_text(textwrap.dedent(f"""\
        - name: open the feature
          gate_patch:
            target_sm: sm120
            feature: {feature}
        """))
    return tmp_path / "roles"


@pytest.mark.parametrize("feature, says", [
    ("deepgemm", "feature 'deepgemm' has no patch recipe"),
    ("no_such_feature", "gate catalog: no feature 'no_such_feature'"),
])
def test_the_role_argument_reaches_the_planner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               feature: str, says: str) -> None:
    monkeypatch.setenv("GPUOPS_ROLES_PATH", str(role_with_feature(tmp_path, feature)))
    with pytest.raises(GpuopsError) as refused:
        discover("open-feature", "h01", {"gpuops_state_dir": "/s"}, {})
    text = str(refused.value)
    assert text.startswith("roles/open-feature/tasks.yml") and says in text and "\n" not in text, text


def test_an_unknown_feature_in_a_role_is_one_line_exit_2_before_any_host(tmp_path: Path) -> None:
    roles = role_with_feature(tmp_path, "no_such_feature")
    # The inventory's host does not exist: the refusal must come before any connection is tried.
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01: {ansible_host: 192.0.2.1}\n")
    done = subprocess.run([sys.executable, "-m", "gpuops.cli", "apply", "open-feature", "-i", "hosts.yml", "--check"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "GPUOPS_ROLES_PATH": str(roles)})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "no feature 'no_such_feature'" in done.stderr, done.stderr
