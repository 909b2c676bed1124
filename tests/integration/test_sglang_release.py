"""gpuops apply sglang-release on a lab host: 0.5.8 -> 0.5.21 -> back, for real.

The new environment is built on the host from a wheelhouse copied from here: the real sglang
0.5.21 wheel plus the lab's stand-ins for what it requires (gpuops/lab/wheelhouse.py), with the
real uv the test extra installs on the host's PATH (the venv + pip branch is built end to end by
test_quickstart, managers/test_systemd_manager and test_sglang_release_faults). The lab's stand-in
server then serves the release that environment holds.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from gpuops import memo
from gpuops.lab.hosts import LabSpec
from gpuops.lab.wheelhouse import build_wheelhouse
from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"), ["0.5.21"])


def _apply(run_gpuops, lab, envs: Path, wheelhouse: Path, *args: str, kept: Path | None = None):
    """``kept``: a memo of this test's own (``GPUOPS_KEEP``), so what it holds is known."""
    return run_gpuops("apply", "sglang-release", "-i", str(lab.inventory_path), "-e", f"gpuops_envs_dir={envs}",
                      "-e", f"sglang_wheelhouse={wheelhouse}", "--json", *args, timeout=600,
                      env={memo.KEEP_ENV: str(kept)} if kept else None)


def _with_envs_dir(inventory: Path, envs: Path, out: Path) -> Path:
    """The lab's inventory with the host var gpuops_envs_dir (inspect lists the environments there)."""
    data = yaml.safe_load(inventory.read_text())
    for host_vars in data["all"]["children"]["lab"]["hosts"].values():
        host_vars["gpuops_envs_dir"] = str(envs)
    out.write_text(yaml.safe_dump(data))
    return out


def _pid(state: Path) -> str:
    return (state / "sglang.pid").read_text().strip()


def _unchanged(host, before: dict[str, str], pid: str, version: str = "0.5.8") -> None:
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert _pid(host.state_dir) == pid, "the server was restarted"
    assert server_info(host.server_port)["version"] == version


@pytest.mark.timeout(1200)  # a real venv + pip install of ~80 wheels, on a shared machine
def test_release_refusals_switch_and_rollback(lab_factory, run_gpuops, wheelhouse, tmp_path, monkeypatch) -> None:
    lab = lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("rel",)))
    host = lab.hosts[0]
    uv = Path(sys.executable).with_name("uv")
    assert uv.is_file(), f"{uv} is missing: pip install -e '.[test]' installs uv"
    (host.bin_dir / "uv").symlink_to(uv)  # the host has uv: the release is built with it
    envs = tmp_path / "envs"
    kept = tmp_path / "kept"
    before = tree_hashes(host.dir, skip_runs=True)
    old_tree = tree_hashes(host.dir / "site")
    pid = _pid(host.state_dir)
    assert server_info(host.server_port)["version"] == "0.5.8"

    # A release that does not exist: refused before any host is reached.
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.999")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "holds no wheel of sglang 0.5.999" in proc.stderr and "Traceback" not in proc.stderr
    # A flag the new release's parser does not have (0.5.21 dropped --torchao-config).
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.21",
                  "-e", '{"sglang_extra_args": ["--torchao-config", "int4wo-128"]}')
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "SGLang 0.5.21's server has no flag --torchao-config" in proc.stdout + proc.stderr
    # Not enough disk for the new environment.
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.21",
                  "-e", "gpuops_release_min_free_gib=1000000")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["rel"]
    assert report["status"] == "refused" and "GiB free" in report["error"], report
    # A pin that cannot be installed: the wheelhouse lacks the torch the release pins.
    partial = tmp_path / "partial-wheelhouse"
    shutil.copytree(wheelhouse, partial, ignore=shutil.ignore_patterns("torch-*"))
    proc = _apply(run_gpuops, lab, envs, partial, "-e", "sglang_version=0.5.21")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["rel"]
    assert report["status"] == "refused" and "torch" in report["error"], report
    assert "refused before the server stopped" in report["error"]
    # the refusal's line says why: uv's error line with the cause after it (its last line alone would not)
    assert "torch was not found" in report["error"].splitlines()[0], report["error"]
    for refused in (envs.glob("sglang-*") if envs.exists() else []):
        raise AssertionError(f"a refused build left {refused}")
    _unchanged(host, before, pid)

    # --check says what would be built and launched; nothing changes, nothing is built.
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.21", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["rel"]
    assert any("SGLang 0.5.21: environment" in n and "torch 2.13.0" in n for n in report["notes"]), report
    assert any("not on the host yet" in n for n in report["notes"]), report
    _unchanged(host, before, pid)
    assert not (envs.exists() and list(envs.glob("sglang-*")))

    # Staged: the environment is built and its gate audit shown; the server keeps running the old one.
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.21", "-e", "sglang_release_stage=true",
                  kept=kept)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["rel"]
    assert report["status"] == "staged", report
    assert any("built with uv in" in n for n in report["notes"]), report["notes"]
    audit = [n for n in report["notes"] if n.startswith("gate audit, sglang 0.5.8 (running) -> 0.5.21")]
    assert audit and "opens" in audit[0] and "closes" in audit[0], report["notes"]
    _unchanged(host, before, pid)
    (env,) = envs.glob("sglang-0.5.21-*")
    # --check now shows the same audit, from the environment that is there; the two scans the staged
    # run kept answer, the running tree's and the new environment's.
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.21", "--check", "-v", kept=kept)
    assert "gate scan: scanned" not in proc.stderr and proc.stderr.count("rel: gate scan: tree unchanged") == 2, \
        proc.stderr
    report = json.loads(proc.stdout)["hosts"]["rel"]
    assert audit[0] in report["notes"] and any("found finished" in n for n in report["notes"]), report
    _unchanged(host, before, pid)

    # The switch: the launch points at the new environment, which holds the release's pins.
    # --flush-cache: no kept scan is offered to the audits, not even another host's of the same
    # trees (both trees scanned again, and kept).
    monkeypatch.setenv(memo.KEEP_ENV, str(kept))
    for key in memo.keys_of_other_scopes(memo.Kind.SCANS, "another-host"):
        memo.put(memo.Key(memo.Kind.SCANS, key.digest, "another-host"), memo.get(key) or {})
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.21", "--flush-cache", "-v", kept=kept)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tree unchanged" not in proc.stderr and proc.stderr.count("rel: gate scan: scanned") == 2, proc.stderr
    report = json.loads(proc.stdout)["hosts"]["rel"]
    assert report["status"] == "finished", report
    assert any("found finished" in n for n in report["notes"]), report
    probe = ("import json, importlib.metadata as m; print(json.dumps({d: m.version(d) for d in "
             "('sglang', 'torch', 'flashinfer-python', 'sglang-kernel')}))")
    held = json.loads(subprocess.run([str(env / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                                     env={"PATH": "/usr/bin:/bin"}, check=True).stdout)
    assert held == {"sglang": "0.5.21", "torch": "2.13.0+cu130", "flashinfer-python": "0.6.18",
                    "sglang-kernel": "0.4.7"}, held  # 0.5.21's own pins (its METADATA)
    assert server_info(host.server_port)["version"] == "0.5.21"
    # 0.5.21 recommends `sglang serve` and pip wrote the environment's bin/sglang: the launch runs it,
    # read from the environment once built (its python was not there when the run gathered).
    exec_line = next(ln for ln in (host.state_dir / "sglang-launch.sh").read_text().splitlines() if ln.startswith("exec "))
    assert shlex.split(exec_line)[1:4] == [str(env / "bin" / "python"), str(env / "bin" / "sglang"), "serve"], exec_line
    served = (Path("/proc") / str(_pid(host.state_dir)) / "cmdline").read_bytes().split(b"\0")
    assert str(env / "bin" / "sglang").encode() in served and b"serve" in served, served
    assert tree_hashes(host.dir / "site") == old_tree  # the old environment, untouched
    inventory = _with_envs_dir(lab.inventory_path, envs, tmp_path / "inventory.yml")
    inspect = run_gpuops("inspect", "host", "-i", str(inventory), "--json", timeout=300)
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    managed = json.loads(inspect.stdout)["hosts"]["rel"]["managed_launch"]
    assert managed["python"] == str(env / "bin" / "python"), managed
    assert [(e["path"], e["version"], e["launched"]) for e in managed["environments"]] == [(str(env), "0.5.21", True)]
    text = run_gpuops("inspect", "host", "-v", "-i", str(inventory), timeout=300).stdout
    assert f"release environment: {env} (sglang 0.5.21, launched" in text, text
    entry = json.loads(inspect.stdout)["hosts"]["rel"]
    software = entry["facts"]["software"]
    assert software["sglang"]["version"] == "0.5.21", software
    assert software["sglang"]["path"].startswith(str(env)), software["sglang"]  # its gates: the new tree's
    assert entry["gates_error"] is None and entry["gates"], entry.get("gates_error")
    assert "capability gates in sglang 0.5.21" in text, text
    assert software["python"]["executable"] == str(env / "bin" / "python"), software
    assert software["torch"]["version"] == "2.13.0+cu130", software

    # Back: gpuops rollback is a restart of the old environment, in seconds.
    started = time.monotonic()
    proc = run_gpuops("rollback", "-i", str(lab.inventory_path), "--json", timeout=300)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < 20, f"rollback took {took:.1f} s"
    assert server_info(host.server_port)["version"] == "0.5.8"
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert env.is_dir(), "the release environment is kept for a switch back"


    # A source patch of the running release (fusion-sm120 on 0.5.8) is not carried to 0.5.21: the new
    # tree's own verdict decides, before anything stops. 0.5.21 as published keeps the fusion closed
    # on SM120, so the switch is refused, naming the run and the way through. (The lab host carries
    # 0.5.8's FlashInfer 0.6.1 as metadata only, which the kernel rule refuses: the override lets the
    # patch stand, as an operator could.)
    fusion = run_gpuops("apply", "fusion-sm120", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=60",
                        "-e", "gpuops_stop_grace=5", "-e", "fusion_allow_without_p2p=true",
                        "-e", "fusion_allow_without_kernel=true", "--json", timeout=300)
    assert fusion.returncode == 0, fusion.stdout + fusion.stderr
    fusion_run = json.loads(fusion.stdout)["hosts"]["rel"]["run_id"]
    patched, pid = tree_hashes(host.dir, skip_runs=True), _pid(host.state_dir)
    proc = _apply(run_gpuops, lab, envs, wheelhouse, "-e", "sglang_version=0.5.21")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["rel"]
    assert report["status"] == "refused", report
    assert f"fusion-sm120 (run {fusion_run}) patched SGLang 0.5.8 to open flashinfer_allreduce_fusion" in report["error"]
    assert f"gpuops rollback --run {fusion_run}" in report["error"] and "nothing was changed" in report["error"]
    assert tree_hashes(host.dir, skip_runs=True) == patched and _pid(host.state_dir) == pid
