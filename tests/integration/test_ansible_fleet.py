"""An Ansible-shaped fleet through gpuops apply on real sshd lab hosts with stand-in servers:
rolling restarts (--serial, --max-fail-percentage), become from the inventory with a vaulted
password, and ansible_python_interpreter."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from labtools import tree_hashes

pytestmark = pytest.mark.integration

# ansible-vault encrypt_string --vault-password-file pw 's3cret-value'   (pw: first-pw)
VAULTED_BECOME_PASSWORD = """\
!vault |
  $ANSIBLE_VAULT;1.1;AES256
  64386339353636656338636632626364303965313935666139626232646663333962303466336565
  6565383238653165653262353064373039626133346331300a653334613636393336333232623831
  39643936343533613532626534626362613861313766356438616138363233376139336566616232
  3333356238663139650a373131316631316463663430353431383664356163336536333264646238
  3262
"""

# A sudo first on each lab host's PATH: checks the password on stdin, logs that it ran.
FAKE_SUDO = """\
#!/bin/sh
while [ "$1" != "--" ]; do
  if [ "$1" = "-S" ]; then IFS= read -r pw; [ "$pw" = s3cret-value ] || { echo "sudo: wrong password" >&2; exit 1; }; fi
  shift
done
echo ran >> {log}
shift; exec "$@"
"""


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang=None, count=3)


def apply(run_gpuops, *args: str) -> Any:
    return run_gpuops("apply", "nccl-env", "-e", "gpuops_health_timeout=30", "-e", "gpuops_stop_grace=5", *args,
                      env={"XDG_STATE_HOME": ""})


def mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


def test_serial_1_restarts_the_hosts_strictly_one_after_another(lab, run_gpuops) -> None:
    proc = apply(run_gpuops, "-i", str(lab.inventory_path), "--serial", "1", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 3}}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    h01, h02, h03 = (lab.host(n) for n in ("h01", "h02", "h03"))
    # Each host's run ends (server healthy, journal committed) before the next host's new server
    # is started (its pid file written): causal order, not timing.
    assert mtime(h01.state_dir / "journal.jsonl") < mtime(h02.state_dir / "sglang.pid")
    assert mtime(h02.state_dir / "journal.jsonl") < mtime(h03.state_dir / "sglang.pid")
    for host in (h01, h02, h03):
        assert "NCCL_MIN_NCHANNELS='3'" in (host.state_dir / "sglang.env").read_text()


def test_a_failing_host_stops_the_rollout_and_later_hosts_stay_untouched(lab, run_gpuops, tmp_path: Path) -> None:
    inventory = yaml.safe_load(lab.inventory_path.read_text())
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    del hosts["h02"]["gpuops_python"]
    hosts["h02"]["ansible_python_interpreter"] = "/nonexistent/python3"
    path = tmp_path / "fleet.yml"
    path.write_text(yaml.safe_dump(inventory))
    # A second -i source: become for every host, with a password from the vault (Ansible's way).
    (tmp_path / "become.yml").write_text("all:\n  vars:\n    ansible_become: true\n    ansible_become_password: "
                                         + textwrap.indent(VAULTED_BECOME_PASSWORD, "      ").lstrip())
    (tmp_path / "pw").write_text("first-pw\n")
    for host in lab.hosts:
        sudo = host.bin_dir / "sudo"
        sudo.write_text(FAKE_SUDO.replace("{log}", str(host.dir / "sudo.log")))
        sudo.chmod(0o755)
    h03 = lab.host("h03")
    h03_before, h03_pid = tree_hashes(h03.dir), (h03.state_dir / "sglang.pid").read_text()
    proc = apply(run_gpuops, "-i", str(path), "-i", str(tmp_path / "become.yml"), "--vault-password-file",
                 str(tmp_path / "pw"), "--serial", "1", "--max-fail-percentage", "0", "--json",
                 "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 5}}')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]
    assert report["h01"]["ok"] and report["h01"]["status"] == "finished"
    assert (lab.host("h01").dir / "sudo.log").exists()  # h01's run went through sudo
    assert report["h02"]["status"] in ("failed", "unknown"), report["h02"]["error"]  # apply calls a helper that never started "unknown"
    assert "no python: gpuops_python /nonexistent/python3 (or ansible_python_interpreter) is not an executable on this host" in report["h02"]["error"]
    assert report["h03"]["status"] == "skipped"
    assert report["h03"]["error"].startswith("not attempted: 1 of 1 host(s) failed in batch 2")
    assert tree_hashes(h03.dir) == h03_before and not (h03.dir / "sudo.log").exists()
    assert (h03.state_dir / "sglang.pid").read_text() == h03_pid
    assert "s3cret-value" not in proc.stdout + proc.stderr
    human = apply(run_gpuops, "-i", str(path), "-i", str(tmp_path / "become.yml"), "--vault-password-file",
                  str(tmp_path / "pw"), "--serial", "1", "--max-fail-percentage", "0",
                  "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 5}}')
    assert "h03: SKIPPED (skipped)" in human.stdout and "h03 : ok=0 changed=0 failed=0 skipped=1" in human.stdout
    assert "s3cret-value" not in human.stdout + human.stderr


def test_a_vaulted_value_is_masked_in_diffs_whatever_its_name(lab, run_gpuops, tmp_path: Path) -> None:
    envelope = textwrap.indent(VAULTED_BECOME_PASSWORD, "    ").lstrip()
    (tmp_path / "env.yml").write_text(f"sglang_env:\n  MODEL_SOURCE: {envelope}")
    (tmp_path / "pw").write_text("first-pw\n")
    proc = run_gpuops("apply", "sglang-service", "-i", str(lab.inventory_path), "-l", "h01", "-C", "-D",
                      "-e", f"@{tmp_path / 'env.yml'}", "--vault-password-file", str(tmp_path / "pw"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MODEL_SOURCE='<masked:" in proc.stdout, proc.stdout
    assert "s3cret-value" not in proc.stdout + proc.stderr


def test_apply_over_the_openssh_connection_with_its_transaction_channel(lab, run_gpuops) -> None:
    import tempfile

    control = tempfile.mkdtemp(prefix="gcm")
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "-l", "h01", "--connection", "openssh", "-vv",
                      "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 7}}', "-e", "gpuops_health_timeout=30",
                      env={"XDG_STATE_HOME": "", "GPUOPS_SSH_CONTROL_DIR": control})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NCCL_MIN_NCHANNELS='7'" in (lab.host("h01").state_dir / "sglang.env").read_text()
    assert "transaction channel" in proc.stderr and "h01: transaction finished in " in proc.stderr, proc.stderr
    assert len(os.listdir(control)) == 1  # the master every command of the run shared
