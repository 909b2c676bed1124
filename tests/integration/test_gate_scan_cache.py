"""The kept gate scan (gates/scan_cache.py, remote/scan_fingerprint.py) over a real sshd lab host with
the real SGLang 0.5.8 source: an unchanged tree is not scanned again, and no change gpuops makes (or
anyone makes) is ever served a stale scan.

What was done is read from ``inspect host --json`` (``gate_scan.cached``) and from ``-v`` (the line
each host's scan prints), never from timings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from labtools import FUSION_FLASHINFER

pytestmark = pytest.mark.integration

FUSION = "flashinfer_allreduce_fusion"


@pytest.fixture()
def lab(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.8", flashinfer=FUSION_FLASHINFER)  # its own: the test patches it


def inspect(run_gpuops, lab, env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "--json", *args, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["hosts"]["h01"]


def apply(run_gpuops, lab, env: dict[str, str], *args: str):
    proc = run_gpuops("apply", "fusion-sm120", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=60",
                      "-e", "gpuops_stop_grace=5", "-e", "fusion_allow_without_p2p=true", "-v", *args,
                      env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_kept_scan_is_used_only_while_the_tree_is_unchanged(lab, run_gpuops, tmp_path: Path) -> None:
    env = {"GPUOPS_KEEP": str(tmp_path / "kept")}
    host = lab.hosts[0]

    first = inspect(run_gpuops, lab, env)
    assert first["gate_scan"]["cached"] is False and first["gate_scan"]["fingerprint"]
    assert first["features"][FUSION]["status"] == "blocked"
    second = inspect(run_gpuops, lab, env)
    assert second["gate_scan"] == {"cached": True, "fingerprint": first["gate_scan"]["fingerprint"]}
    assert second["gates"] == first["gates"] and second["features"] == first["features"]
    # --flush-cache: the host's kept scans and their verdicts are deleted (an older tree's entry too),
    # the host scans and judges again, same report, and what it found is kept again.
    kept = tmp_path / "kept"
    (scope,) = (kept / "scans").iterdir()
    fingerprint = first["gate_scan"]["fingerprint"]
    older = "c" * 64
    for entry in (scope / f"{fingerprint}.json", *(kept / "judged").glob("*.json")):
        text = entry.read_text().replace(fingerprint, older)
        (entry.parent / f"{older}.json").write_text(text.replace(entry.stem, older))
    flushed = inspect(run_gpuops, lab, env, "--flush-cache")
    assert flushed["gate_scan"] == {"cached": False, "fingerprint": fingerprint}
    assert flushed["gates"] == first["gates"] and flushed["features"] == first["features"]
    assert not (scope / f"{older}.json").exists() and not (kept / "judged" / f"{older}.json").exists()
    assert (scope / f"{fingerprint}.json").exists() and len(list((kept / "judged").glob("*.json"))) == 1

    # gpuops' own patch: the very next command sees the patched tree, never the kept scan.
    patched = apply(run_gpuops, lab, env)
    assert "h01: gate scan: tree unchanged" in patched.stderr  # inspect's kept scan carries the sources apply needs
    after = inspect(run_gpuops, lab, env)
    assert after["gate_scan"]["cached"] is False
    assert after["gate_scan"]["fingerprint"] != first["gate_scan"]["fingerprint"]
    assert after["features"][FUSION]["status"] == "open", after["features"][FUSION]

    # A no-op apply after that: the tree is the one the first no-op scanned, so the second uses it.
    noop = apply(run_gpuops, lab, env, "--json")
    assert json.loads(noop.stdout)["hosts"]["h01"]["status"] == "unchanged"
    noop = apply(run_gpuops, lab, env, "--json")
    assert json.loads(noop.stdout)["hosts"]["h01"]["status"] == "unchanged"
    assert "h01: gate scan: tree unchanged" in noop.stderr, noop.stderr
    assert inspect(run_gpuops, lab, env)["gate_scan"]["cached"] is True  # the kept scan with sources serves inspect

    # Anyone's change on the host: a new module with a gate (the lab's release files are hard links
    # of a shared unpack, so nothing is edited in place here).
    extra = host.site_dir / "sglang" / "srt" / "gpuops_cache_probe.py"
    extra.write_text("from sglang.srt.utils import is_sm100_supported\n\n\ndef use_it():\n"
                     "    if is_sm100_supported():\n        return 1\n    return 0\n")
    changed = inspect(run_gpuops, lab, env)
    assert changed["gate_scan"]["cached"] is False
    assert any(g["file"] == "srt/gpuops_cache_probe.py" for g in changed["gates"])
    extra.unlink()

    # Rollback restores the files: the gates are closed again, and inspect says so.
    undo = run_gpuops("rollback", "-i", str(lab.inventory_path), env=env, timeout=300)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    rolled = inspect(run_gpuops, lab, env)
    assert rolled["gate_scan"]["cached"] is False
    assert rolled["features"][FUSION]["status"] == "blocked"
    assert not any(g["file"] == "srt/gpuops_cache_probe.py" for g in rolled["gates"])


def test_same_size_rewrite_with_the_old_mtime_is_still_seen(lab, run_gpuops, tmp_path: Path) -> None:
    """A file replaced through a rename with the same size and the old mtime put back (what a careful
    copy tool does) has a new inode: scanned again, and the change is in the result."""
    env = {"GPUOPS_KEEP": str(tmp_path / "kept")}
    comm = lab.hosts[0].site_dir / "sglang" / "srt" / "layers" / "communicator.py"
    first = inspect(run_gpuops, lab, env)
    assert inspect(run_gpuops, lab, env)["gate_scan"]["cached"] is True
    text = comm.read_text()
    old = "(_is_sm90_supported or _is_sm100_supported)"
    assert old in text
    new = "(_is_sm100_supported or _is_sm90_supported)"  # the same length: the same size
    stat = comm.stat()
    tmp = comm.with_name(".communicator.py.edit")
    tmp.write_text(text.replace(old, new, 1))
    os.utime(tmp, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.chmod(tmp, stat.st_mode & 0o7777)
    os.replace(tmp, comm)
    assert comm.stat().st_size == stat.st_size and comm.stat().st_mtime_ns == stat.st_mtime_ns
    again = inspect(run_gpuops, lab, env)
    assert again["gate_scan"]["cached"] is False
    assert again["gate_scan"]["fingerprint"] != first["gate_scan"]["fingerprint"]
    assert any(new in (g.get("condition") or "") for g in again["gates"]), "the rescan sees the new condition"
    assert not any(old in (g.get("condition") or "") for g in again["gates"] if g["file"] == "srt/layers/communicator.py")


def _report(proc) -> dict[str, Any]:
    report = dict(json.loads(proc.stdout)["hosts"]["h01"])
    report.pop("run_id", None)
    return report


def test_noop_plan_is_recalled_only_while_every_input_matches(lab, run_gpuops, tmp_path: Path) -> None:
    """apply/noop_memo.py: the second no-op skips planning (its report the same as a planned one);
    drift on the host, other variables or another tree are planned again, and fixed."""
    env = {"GPUOPS_KEEP": str(tmp_path / "kept")}
    host = lab.hosts[0]
    first = apply(run_gpuops, lab, env, "--json")
    assert json.loads(first.stdout)["hosts"]["h01"]["status"] == "finished"
    planned = apply(run_gpuops, lab, env, "--json")
    assert "not planned again" not in planned.stderr
    recalled = apply(run_gpuops, lab, env, "--json")
    assert "h01: plan: inputs unchanged since an empty plan" in recalled.stderr, recalled.stderr
    assert _report(recalled) == _report(planned) and _report(recalled)["status"] == "unchanged"
    assert _report(recalled)["warnings"] and _report(recalled)["notes"]  # the kept report part, not an empty one

    # Drift in a managed file on the host: planned (not recalled) and put back.
    env_file = host.state_dir / "sglang.env"
    wanted = env_file.read_text()
    env_file.write_text(wanted + "NCCL_DEBUG='INFO'\n")
    fixed = apply(run_gpuops, lab, env, "--json")
    assert "not planned again" not in fixed.stderr
    assert _report(fixed)["changed"] >= 1 and _report(fixed)["status"] == "finished", _report(fixed)
    assert env_file.read_text() == wanted

    # Other variables: planned again.
    other_vars = apply(run_gpuops, lab, env, "--json", "-e", "gpuops_stop_grace=6")
    assert "not planned again" not in other_vars.stderr

    # A patched gate put back by someone (through a rename, as the lab's hard links require): the
    # tree's fingerprint changes, so the scan and the plan are redone, and the patch is made again.
    from gpuops.lab.sglang_cache import sglang_site

    comm = host.site_dir / "sglang" / "srt" / "layers" / "communicator.py"
    patched_text = comm.read_text()
    pristine = (sglang_site("0.5.8") / "sglang" / "srt" / "layers" / "communicator.py").read_text()
    assert pristine != patched_text
    tmp = comm.with_name(".communicator.py.put-back")
    tmp.write_text(pristine)
    os.replace(tmp, comm)
    again = apply(run_gpuops, lab, env, "--json")
    assert "not planned again" not in again.stderr and "tree unchanged" not in again.stderr
    assert _report(again)["status"] == "finished" and _report(again)["changed"] >= 1
    assert comm.read_text() == patched_text


def test_server_fields_left_out_of_the_verdicts_digest_do_not_change_a_verdict() -> None:
    """judge_memo.SERVER_FIELDS_NOT_JUDGED: judging must not read them (else they belong in the digest)."""
    from gpuops.gates.evaluate import judge
    from gpuops.gates.judge_memo import SERVER_FIELDS_NOT_JUDGED
    from gpuops.lab.sglang_cache import sglang_site

    site = sglang_site("0.5.8")  # a real release: every kind of gate judging meets
    from gpuops.gates.local import scan_site

    scan = scan_site(site)
    assert scan.known, scan.reason
    base = {"running": True, "args": {"--tp-size": "8"}, "architecture": "DeepseekV3ForCausalLM", "gpu_name": "NVIDIA H200"}
    for name in SERVER_FIELDS_NOT_JUDGED:
        reports = [judge(scan, cc, "12.8", {**base, name: value}, interconnect={"nvlink": False}).to_json()
                   for cc in ("12.0", "9.0") for value in ([], [{"pid": 1, "port": 30001}], None)]
        assert reports[0] == reports[1] == reports[2] and reports[3] == reports[4] == reports[5], name
