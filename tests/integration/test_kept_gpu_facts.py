"""Kept GPU facts (apply/kept_facts.py) over a real sshd lab host with SGLang 0.5.8's real source: a
no-op apply skips nvidia-smi and the package probe only while nothing they read has changed, and
reports exactly what a full gather reports; a swapped GPU set or an upgraded torch is gathered again.

What ran on the host is read from the lab's nvidia-smi (each call logged by a wrapper), from ``-v``
and from the reports, never from timings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

FUSION_WARNING = "peer-to-peer is not possible between 16 GPU pair(s)"
KEPT_LINE = "h01: GPU facts: fingerprint unchanged"


@pytest.fixture()
def lab(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.8")  # its own: the test patches it and swaps GPUs


def _apply(run_gpuops, lab, env: dict[str, str], *args: str):
    proc = run_gpuops("apply", "fusion-sm120", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=60",
                      "-e", "gpuops_stop_grace=5", "-e", "fusion_allow_without_p2p=true",
                      # The lab's FlashInfer is 0.6.1's version data: refused by the version rule unless
                      # told; what this test follows is the kept GPU facts, not the kernel library.
                      "-e", "fusion_allow_without_kernel=true", "-v", "--json", *args,
                      env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _report(proc) -> dict[str, Any]:
    report = dict(json.loads(proc.stdout)["hosts"]["h01"])
    report.pop("run_id", None)
    return report


def _replace(path: Path, text: str, mode: int = 0o644) -> None:
    """Write through a rename, as pip and the lab's hard-linked trees require."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _log_smi_calls(host_dir: Path, log: Path, description: Path | None = None) -> None:
    """Wrap the lab's nvidia-smi so every call is logged (and, with ``description``, replay other GPUs)."""
    smi = host_dir / "bin" / "nvidia-smi"
    original = host_dir / "bin" / "nvidia-smi.lab"
    if not original.exists():
        original.write_text(smi.read_text())
    lines = original.read_text().splitlines()
    if description is not None:
        lines = [line.replace(str(host_dir / "gpu.json"), str(description)) for line in lines]
    lines.insert(2, f"echo \"$*\" >> '{log}'")
    _replace(smi, "\n".join(lines) + "\n", 0o755)


def test_a_no_op_skips_gpu_probes_only_while_nothing_they_read_changed(lab, run_gpuops, tmp_path: Path) -> None:
    env = {"GPUOPS_KEEP": str(tmp_path / "kept")}
    host = lab.hosts[0]
    calls = tmp_path / "smi-calls"
    _log_smi_calls(host.dir, calls)

    changed = _apply(run_gpuops, lab, env)
    assert _report(changed)["status"] == "finished"
    full = _apply(run_gpuops, lab, env)  # second run: the fingerprint now covers the python's dirs
    assert KEPT_LINE not in full.stderr and calls.read_text().count("\n") == 8  # 4 nvidia-smi calls a gather
    kept = _apply(run_gpuops, lab, env)
    assert KEPT_LINE in kept.stderr, kept.stderr
    assert calls.read_text().count("\n") == 8  # not one call more
    assert _report(kept) == _report(full) and _report(kept)["status"] == "unchanged"
    assert any(FUSION_WARNING in w for w in _report(kept)["warnings"])  # the kept summary's P2P gaps

    # torch upgraded in place to another CUDA build (pip renames its dist-info; version.py replaced)
    site = host.dir / "site"
    (site / "torch-2.9.1+cu128.dist-info").rename(site / "torch-2.9.1+cu130.dist-info")
    version = site / "torch" / "version.py"
    _replace(version, version.read_text().replace("'12.8'", "'13.0'").replace("+cu128", "+cu130"))
    upgraded = _apply(run_gpuops, lab, env)
    assert KEPT_LINE not in upgraded.stderr and calls.read_text().count("\n") == 12
    entry = json.loads(next((tmp_path / "kept" / "facts").glob("*.json")).read_text())
    assert entry["summary"]["cuda"] == "13.0" and entry["fingerprint"]  # same dirs: kept at once

    # Another GPU set behind a new nvidia-smi (as a driver update or a swap brings): gathered again,
    # and the plan follows (the workstation's 4 GPUs have no P2P gap to warn about).
    from gpuops.lab.gpu_description import load_description

    ws = tmp_path / "ws-x4.json"
    ws.write_text(json.dumps(load_description("rtx-pro-6000-ws-x4").replay))
    _log_smi_calls(host.dir, calls, ws)
    swapped = _apply(run_gpuops, lab, env)
    assert KEPT_LINE not in swapped.stderr, swapped.stderr
    assert calls.read_text().count("\n") == 16
    assert not any(FUSION_WARNING in w for w in _report(swapped)["warnings"]), _report(swapped)["warnings"]
    again = _apply(run_gpuops, lab, env)
    assert KEPT_LINE in again.stderr and calls.read_text().count("\n") == 16
    assert _report(again) == _report(swapped)

    # --flush-cache: the host's kept facts, scans and plans are deleted first (memo.forget_hosts), so
    # nothing is offered or recalled; the report is the same, and what it found is kept again: the
    # next run recalls the scan and the plan, and gathers the GPU facts once more, as after a first
    # run (the summary is kept at once, its fingerprint needs the directories this gather reported).
    flushed = _apply(run_gpuops, lab, env, "--flush-cache")
    assert calls.read_text().count("\n") == 20
    for line in (KEPT_LINE, "tree unchanged", "not planned again"):
        assert line not in flushed.stderr, flushed.stderr
    assert _report(flushed) == _report(swapped)
    assert [json.loads(p.read_text())["fingerprint"] for p in (tmp_path / "kept" / "facts").glob("*.json")] == [None]
    after = _apply(run_gpuops, lab, env)
    assert KEPT_LINE not in after.stderr and "tree unchanged" in after.stderr and "not planned again" in after.stderr
    assert calls.read_text().count("\n") == 24

    # Turned off: every run gathers.
    off = _apply(run_gpuops, lab, {**env, "GPUOPS_KEEP": "off"})
    assert KEPT_LINE not in off.stderr and calls.read_text().count("\n") == 28
    assert _report(off) == _report(swapped)


def test_inspect_never_uses_kept_gpu_facts(lab, run_gpuops, tmp_path: Path) -> None:
    """inspect reports live values (memory in use, clocks): it always asks nvidia-smi, even for a
    host whose GPU facts apply holds with a fingerprint (two applies first, the second kept them)."""
    env = {"GPUOPS_KEEP": str(tmp_path / "kept")}
    calls = tmp_path / "smi-calls"
    _log_smi_calls(lab.hosts[0].dir, calls)
    for _ in range(2):
        _apply(run_gpuops, lab, env)
    assert KEPT_LINE in _apply(run_gpuops, lab, env).stderr  # apply would skip nvidia-smi now
    before = len(calls.read_text().splitlines())
    for round_ in (1, 2):
        proc = run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "--json", "-v", env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "GPU facts:" not in proc.stderr
        assert len(calls.read_text().splitlines()) >= before + 4 * round_
