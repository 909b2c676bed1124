"""The host-side readers of the SGLang tree touch only regular files, and only so much (issue 42).

A FIFO named ``x.py`` in the tree made the gate scan block for good (``inspect host`` lost the host
after 120 s, and a python3 stayed blocked on the host); a link named ``y.py`` to /dev/zero, or a
sparse file of a terabyte, made it read until memory ran out. The scan and the package probe run
here as a host runs them (one script, a subprocess), in their own session with a time and memory
limit: a regression fails the test instead of hanging the suite or eating the machine.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuops.facts.software import remote_source
from gpuops.shipping import source
from gpuops.remote.scan_read import FILE_BYTES_MAX, SCAN_BYTES_MAX
from gpuops.remote.scan_scanner import Scanner
from gpuops.lab.sglang_cache import cache_root, sglang_site

from labtools import require_python

GATE = "def f():\n    if is_sm100_supported():\n        raise RuntimeError('needs SM100')\n"
TIME_LIMIT_S = 30  # the scan of this tree takes well under a second; a blocked one never ends


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a read of /dev/zero stops here


def _run(argv: list[str], stdin: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``argv`` with ``stdin``, killed with its whole session past the time limit (a python
    blocked on a FIFO stays blocked when only its parent is killed)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, preexec_fn=_limit_memory)
    try:
        out, err = proc.communicate(stdin, timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    if proc.returncode == -signal.SIGKILL:  # failed here, not inside the except: no chained traceback
        pytest.fail(f"{argv[0]} did not end within {TIME_LIMIT_S} s: it blocked on something in the tree")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), time.monotonic() - started


def _hostile_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    pkg = site / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "gate.py").write_text(GATE)
    (pkg / "srt" / "plain.py").write_text("X = 1\n")
    os.mkfifo(pkg / "srt" / "x.py")
    os.symlink("/dev/zero", pkg / "srt" / "y.py")  # the walk follows a symlinked file
    with open(pkg / "srt" / "z.py", "wb") as handle:
        handle.truncate(1 << 40)  # sparse: a terabyte that takes no disk
    os.symlink("w.py", pkg / "srt" / "w.py")  # a link to itself
    os.symlink("missing", pkg / "srt" / "v.py")
    (pkg / "srt" / "linked.py").symlink_to(pkg / "srt" / "plain.py")  # a real file behind a link: read
    os.mkfifo(pkg / "version.py")  # find_version reads it when the metadata has no version
    meta = site / "sglang-0.5.99.dist-info"
    meta.mkdir()
    os.mkfifo(meta / "METADATA")
    return site


@pytest.mark.parametrize("version", [None, "3.8"], ids=["this-python", "python3.8"])  # hosts may be 3.8
def test_the_scan_skips_what_is_not_a_regular_file_and_reports_the_rest(tmp_path: Path, version: str | None) -> None:
    python = require_python(version) if version else sys.executable
    pkg = _hostile_site(tmp_path) / "sglang"
    done, took = _run([python, "-I", "-", json.dumps({"root": str(pkg), "jobs": 1})], source("gate_scan"))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"], out.get("reason")
    assert took < TIME_LIMIT_S and out["elapsed_s"] < 5
    errors = {e["file"]: e["error"] for e in out["errors"]}
    assert errors == {
        "srt/x.py": "not a regular file (a FIFO)",
        "srt/y.py": "not a regular file (a character device)",
        "srt/z.py": "too large (%d bytes; the limit is %d)" % (1 << 40, FILE_BYTES_MAX),
        "srt/w.py": "cannot read: Too many levels of symbolic links",
        "srt/v.py": "cannot read: No such file or directory",
        "version.py": "not a regular file (a FIFO)",
    }
    assert out["version"] is None  # neither the FIFO METADATA nor the FIFO version.py was read
    assert out["files_total"] == 10
    assert [g["file"] for g in out["gates"]] == ["srt/gate.py"]


def test_the_scan_stops_reading_at_its_total_limit(tmp_path: Path) -> None:
    pkg = tmp_path / "sglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in "abcd":
        (pkg / f"{name}.py").write_text("#" * 99 + "\n")  # 100 bytes each
    scanner = Scanner(str(pkg))
    scanner.read_files(file_max=150, scan_max=250)
    assert sorted(scanner.texts) == ["__init__.py", "a.py", "b.py"]
    reason = "not read: the scan's limit of 250 bytes in all was reached"
    assert scanner.errors == [{"file": "c.py", "error": reason}, {"file": "d.py", "error": reason}]


def real_releases() -> list[Path]:
    """Every real release this machine has cached (0.5.23 fetched first if it has none: a fresh
    machine's run then checks one instead of skipping, which the skip policy fails)."""
    sglang_site("0.5.23")
    base = cache_root().parent
    return sorted(base.glob("sglang/*/site/sglang")) + sorted(base.glob("flashinfer/*/site/flashinfer"))


def test_the_limits_leave_every_cached_real_release_whole() -> None:
    """The bounds are far above the real releases (scan_read.py says the figures): each release's
    largest file has 4x to spare, and its total 4x."""
    from gpuops.remote.scan_discovery import walk_python_files

    for root in real_releases():
        sizes = [os.stat(path).st_size for _, path in walk_python_files(str(root))]
        assert max(sizes) * 4 <= FILE_BYTES_MAX, root
        assert sum(sizes) * 4 <= SCAN_BYTES_MAX, root


def test_the_package_probe_skips_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """facts/software_remote.py, sent as one script: the version files, the metadata importlib
    reads, and the kernel libraries' files it reads for gates/kernels.py."""
    site = tmp_path / "site"
    for package in ("sglang", "flashinfer", "sgl_kernel", "torch"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    meta = site / "sglang-0.5.99.dist-info"
    meta.mkdir()
    os.mkfifo(meta / "METADATA")
    (site / "sglang" / "version.py").write_text("__version__ = '0.5.99'\n")
    os.mkfifo(site / "torch" / "version.py")
    os.mkfifo(site / "flashinfer" / "comm.py")
    os.symlink("/dev/zero", site / "flashinfer" / "zero.py")
    (site / "flashinfer" / "ok.py").write_text("def gen_x():\n    return spec(supported_major_versions=[10])\n")
    os.mkfifo(site / "sgl_kernel" / "common_ops.abi3.so")
    fi = site / "flashinfer_python-0.6.99.dist-info"
    fi.mkdir()
    (fi / "METADATA").write_text("Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.6.99\n")
    kernel = site / "sgl_kernel-0.3.99.dist-info"
    kernel.mkdir()
    (kernel / "METADATA").write_text("Metadata-Version: 2.1\nName: sgl-kernel\nVersion: 0.3.99\n")
    wanted = {"flashinfer": {"comm.py": {"symbols": ["x"]}, "zero.py": {"symbols": ["x"]},
                             "ok.py": {"generators": True}},
              "sglang": {"version.py": {"symbols": ["__version__"]}},
              "sgl_kernel": {"common_ops": {"arches": True}}}
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONNOUSERSITE="1")
    done, _ = _run([sys.executable, "-S", "-c", remote_source(), json.dumps(wanted)], "", env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["packages"]["sglang"]["version"] == "0.5.99"
    assert out["packages"]["sglang"]["source"] == "version.py"  # the FIFO METADATA was passed over
    assert out["packages"]["torch"] is None or out["packages"]["torch"].get("cuda") is None
    files = out["kernels"]["flashinfer"]["files"]
    assert files["comm.py"] == {"exists": True, "error": "cannot be read: not a regular file"}
    assert files["zero.py"] == {"exists": True, "error": "cannot be read: not a regular file"}
    assert files["ok.py"]["generators"] == {"gen_x": [1, [10], 2]}
    assert out["kernels"]["sglang"]["files"]["version.py"]["symbols"] == {"__version__": 1}
    arches = out["kernels"]["sgl_kernel"]["files"]["common_ops"]["arches"]
    assert arches == {"common_ops.abi3.so": {"error": "cannot read: not a regular file"}}


def test_the_report_names_each_file_not_read_with_why() -> None:
    import io

    from gpuops.gates.evaluate import GateReport
    from gpuops.gates.report import render_gate_summary
    from gpuops.output import make_console

    out = io.StringIO()
    report = GateReport([], {}, errors=[{"file": "srt/x.py", "error": "not a regular file (a FIFO)"},
                                        {"file": "srt/bad.py", "error": "not UTF-8"}])
    render_gate_summary(report, make_console(out, force_terminal=False))
    assert "2 file(s) could not be read or parsed: srt/x.py (not a regular file (a FIFO)), srt/bad.py (not UTF-8)" \
        in out.getvalue().replace("\n", " ")
