"""Bounded reading over real sshd: a host that sends too much fails (that fact, or that command),
and the operator's machine never holds more than a small multiple of the limit.

The probe case is the one seen in the field's threat model: ``nvidia-smi --query-gpu`` replaced by
a program that prints 10 MB or 300 MB. The GPU fact fails with "output over 4 MiB", every other
fact still parses, and gpuops' own memory stays near what it is on a normal host.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.transport.limits import EXEC_OUTPUT_LIMIT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    from gpuops.lab.hosts import LabSpec, start_lab, stop_lab

    lab = start_lab(tmp_path_factory.mktemp("bounded") / "lab", [LabSpec(gpu="rtx-pro-6000-ws-x4", names=("h01",))])
    yield lab
    stop_lab(lab.root)


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_command_over_the_exec_limit_fails_the_host(lab, transport: str) -> None:
    from gpuops.errors import TransportError
    from gpuops.inventory import load_inventory
    from gpuops.transport import ConnectOptions, connect

    host = load_inventory(str(lab.inventory_path)).select(None)[0]
    host = dataclasses.replace(host, vars={**host.vars, "gpuops_connection": transport})
    conn = connect(host, ConnectOptions())
    try:
        with pytest.raises(TransportError, match="h01: output over 64 MiB from one command"):
            conn.run(f"head -c {EXEC_OUTPUT_LIMIT + 1} /dev/zero", timeout=120)
        with pytest.raises(TransportError, match="h01: output over 64 MiB from one command"):
            conn.run("yes >&2", timeout=120)  # stderr too; an endless command is stopped, not waited for
    finally:
        conn.close()


def _replace_query_gpu(lab, size: int) -> None:
    """The host's nvidia-smi answers ``--query-gpu`` with ``size`` bytes; every other call as before."""
    bin_dir = lab.host("h01").bin_dir
    real = bin_dir / "nvidia-smi.real"
    if not real.exists():
        (bin_dir / "nvidia-smi").rename(real)
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text("#!/bin/sh\ncase \"$*\" in *--query-gpu=*) "
                       f"head -c {size} /dev/zero | tr '\\0' 7; exit 0;; esac\nexec \"$(dirname \"$0\")/nvidia-smi.real\" \"$@\"\n")
    wrapper.chmod(0o755)


# Runs gpuops as its child and reports the child's peak memory (the kernel's count, from getrusage).
_MEASURE = ("import resource, subprocess, sys\n"
            "done = subprocess.run(sys.argv[1:])\n"
            "sys.stderr.write('\\nmaxrss_kib=%d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(done.returncode)\n")


def _inspect(lab, home: Path) -> tuple[dict, int]:
    """``gpuops inspect host --json``: its document and its peak memory in KiB."""
    import json

    from gpuops.lab.sglang_cache import cache_root

    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "GPUOPS_LAB_DIR")}
    env.update(HOME=str(home), GPUOPS_CACHE=str(cache_root().parent))
    done = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "gpuops.cli", "inspect", "host",
                           "-i", str(lab.inventory_path), "--json"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode in (0, 1), done.stderr
    rss = int(done.stderr.rsplit("maxrss_kib=", 1)[1])
    return json.loads(done.stdout), rss


def test_a_runaway_probe_fails_its_fact_and_memory_stays_bounded(lab, gpuops_home: Path) -> None:
    import json

    baseline, baseline_rss = _inspect(lab, gpuops_home)
    assert baseline["hosts"]["h01"]["facts"]["gpu_status"]["known"], baseline
    for size in (10 * 1000 * 1000, 300 * 1000 * 1000):
        _replace_query_gpu(lab, size)
        document, rss = _inspect(lab, gpuops_home)
        print(f"query-gpu printing {size} bytes: max RSS {rss} KiB (normal host {baseline_rss} KiB)")
        host = document["hosts"]["h01"]
        assert host["ok"], host
        facts = host["facts"]
        assert "output over 4 MiB" in json.dumps(facts["gpu_status"]), facts["gpu_status"]
        assert facts["server"]["known"] and facts["software"], "the other facts still parse"
        # before the limits: 2.2 GB for the 300 MB probe; now the host cuts it at 4 MiB
        assert rss < baseline_rss + 64 * 1024, (size, rss, baseline_rss)


# Copies a wheelhouse to the lab host as sglang-release does, in a process of its own, and prints
# its peak memory before and after the copy (the kernel's count, getrusage).
_COPY = """
import dataclasses, json, resource, sys
from gpuops.apply.release_env import copy_wheelhouse
from gpuops.inventory import load_inventory
from gpuops.plan.release import ReleaseEnv
from gpuops.transport import ConnectOptions, connect

inventory, transport, envs, folder = sys.argv[1:5]
host = load_inventory(inventory).select(None)[0]
host = dataclasses.replace(host, vars={**host.vars, "gpuops_connection": transport})
conn = connect(host, ConnectOptions())
conn.run("true", timeout=60)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
env = ReleaseEnv("0.5.21", envs, "sglang-0.5.21-000000000000", "python3", (), (), "", folder, 0)
target = copy_wheelhouse(conn, env, host.name)
conn.close()
print(json.dumps({"target": target, "before_kib": before,
                  "after_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_large_wheelhouse_is_streamed_to_the_host_in_bounded_memory(lab, transport: str, tmp_path: Path) -> None:
    """sglang-release copies the operator's wheelhouse to hosts without internet (torch's CUDA
    wheels alone are GiBs): it streams, so gpuops' memory does not grow with the wheelhouse
    (before: the whole tar in a BytesIO, then a copy of it, 2x the wheelhouse)."""
    import hashlib
    import json
    import shutil

    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    size = 160 * 1024 * 1024
    with open(folder / "big-1.0-py3-none-any.whl", "wb") as handle:
        handle.truncate(size)  # sparse here; read as zeros and sent whole
    small = os.urandom(300_000)
    (folder / "small-1.0-py3-none-any.whl").write_bytes(small)
    (folder / "notes.txt").write_text("not a distribution: left out")
    envs = lab.host("h01").dir / f"envs-{transport}"
    done = subprocess.run([sys.executable, "-c", _COPY, str(lab.inventory_path), transport, str(envs), str(folder)],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"})
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        target = Path(out["target"])
        print(f"{transport}: a {size >> 20} MiB wheelhouse copied; max RSS {out['before_kib']} KiB before, "
              f"{out['after_kib']} KiB after")
        assert sorted(p.name for p in target.iterdir()) == ["big-1.0-py3-none-any.whl", "small-1.0-py3-none-any.whl"]
        assert (target / "big-1.0-py3-none-any.whl").stat().st_size == size
        assert hashlib.sha256((target / "small-1.0-py3-none-any.whl").read_bytes()).digest() == hashlib.sha256(small).digest()
        assert not list(target.parent.glob("*.partial"))
        assert out["after_kib"] - out["before_kib"] < 48 * 1024, out  # before the fix: > 320 MiB more
    finally:
        shutil.rmtree(envs, ignore_errors=True)
