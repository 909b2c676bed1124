"""-b/--become on every command that reaches hosts, over real sshd (the lab).

Become is a wrapper of the connection (``transport/become.py``, as Fabric's ``sudo`` wraps ``run``):
inspect, bench, tune, apply, rollback and history all reach the host through it, so every exec of
theirs goes through sudo the same way, with the password on stdin only. The lab host's sudo is a
stand-in first on its PATH that checks the password and logs each call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PASSWORD = "b3c0me 'pw' $(touch /tmp/gpuops-become-pwned)"  # quoting in it must never matter
FAKE_SUDO = """\
#!/bin/sh
while [ "$1" != "--" ]; do
  if [ "$1" = "-S" ]; then IFS= read -r pw; [ "$pw" = "$(cat EXPECTED)" ] || { echo "sudo: wrong password" >&2; exit 1; }; fi
  shift
done
echo call >> LOG
shift; exec "$@"
"""
FAST = {"GPUOPS_STANDIN_TOKENS_PER_S": "2000", "GPUOPS_STANDIN_TTFT_MS": "5"}
BENCH = ["--num-requests", "1", "--warmup", "0", "--input-len", "8", "--output-len", "8"]


@pytest.fixture(scope="module")
def lab(lab_factory):
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, server_env=FAST)
    host = lab.hosts[0]
    (host.dir / "sudo-password").write_text(PASSWORD + "\n")
    sudo = host.bin_dir / "sudo"
    sudo.write_text(FAKE_SUDO.replace("EXPECTED", str(host.dir / "sudo-password")).replace("LOG", str(host.dir / "sudo.log")))
    sudo.chmod(0o755)
    return lab


def sudo_calls(lab) -> int:
    log = lab.hosts[0].dir / "sudo.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_every_host_command_runs_through_sudo_with_b(lab, run_gpuops, tmp_path: Path) -> None:
    inv = str(lab.inventory_path)
    results = str(tmp_path / "results")
    commands = {
        "inspect": ["inspect", "host", "-i", inv, "-b", "--json"],
        "bench": ["bench", "decode", "--remote", "-i", inv, "-b", "--json", "--results-dir", results, *BENCH],
        "apply": ["apply", "nccl-env", "-i", inv, "-b", "--json", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 2}}',
                  "-e", "gpuops_health_timeout=60"],
        "history": ["history", "-i", inv, "-b", "--json"],
        "rollback": ["rollback", "-i", inv, "-b", "--json"],
        "tune": ["tune", "-i", inv, "-b", "--json", "--sweep", "NCCL_ALGO=Ring", "--results-dir", results, *BENCH],
    }
    env_file = lab.hosts[0].state_dir / "sglang.env"
    for name, args in commands.items():
        before = sudo_calls(lab)
        done = run_gpuops(*args, env={"GPUOPS_BECOME_PASS": PASSWORD}, timeout=300)
        assert done.returncode == 0, (name, done.stdout, done.stderr)
        assert sudo_calls(lab) > before, f"{name} -b did not go through sudo"
        assert PASSWORD not in done.stdout + done.stderr, name
        if name == "apply":
            assert "NCCL_MIN_NCHANNELS='2'" in env_file.read_text()
        if name == "history":
            assert any(run.get("role") == "nccl-env" for run in json.loads(done.stdout)["hosts"][lab.hosts[0].name]["runs"])
        if name == "rollback":
            assert "NCCL_MIN_NCHANNELS" not in env_file.read_text()
    assert not Path("/tmp/gpuops-become-pwned").exists()  # the password was data, never code


def test_without_b_nothing_runs_through_sudo(lab, run_gpuops) -> None:
    before = sudo_calls(lab)
    done = run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "--json")
    assert done.returncode == 0, done.stderr
    done = run_gpuops("history", "-i", str(lab.inventory_path), "--json")
    assert done.returncode == 0, done.stderr
    assert sudo_calls(lab) == before


def test_ansible_become_in_the_inventory_is_the_same_become(lab, run_gpuops, tmp_path: Path) -> None:
    """A host's ``ansible_become`` (here from a second -i source, with its password) needs no -b; a
    host's own ``ansible_become: false`` wins over -b, as in Ansible."""
    extra = tmp_path / "become.yml"
    extra.write_text("all:\n  vars:\n    ansible_become: true\n    ansible_become_password: " + json.dumps(PASSWORD) + "\n")
    before = sudo_calls(lab)
    done = run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "-i", str(extra), "--json")
    assert done.returncode == 0, done.stderr
    assert sudo_calls(lab) > before
    extra.write_text("all:\n  vars:\n    ansible_become: false\n")
    before = sudo_calls(lab)
    done = run_gpuops("history", "-i", str(lab.inventory_path), "-i", str(extra), "-b", "--json",
                      env={"GPUOPS_BECOME_PASS": PASSWORD})
    assert done.returncode == 0, done.stderr
    assert sudo_calls(lab) == before


def test_a_wrong_password_fails_the_host_in_one_line_and_changes_nothing(lab, run_gpuops) -> None:
    host = lab.hosts[0]
    env_before = (host.state_dir / "sglang.env").read_text()
    inspect = run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "-b", "--json",
                         env={"GPUOPS_BECOME_PASS": "not-it"})
    # sudo refused the gather: the host fails with why, not with every fact "unknown" and exit 0
    assert inspect.returncode == 1, inspect.stdout + inspect.stderr
    entry = json.loads(inspect.stdout)["hosts"][host.name]
    assert entry["ok"] is False and entry["error"] == "sudo refused: wrong password", entry
    text = run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "-b", env={"GPUOPS_BECOME_PASS": "not-it"})
    (line,) = [l for l in (text.stdout + text.stderr).splitlines() if "sudo refused" in l]
    assert text.returncode == 1 and host.name in line and line.endswith("FAILED: sudo refused: wrong password"), line
    assert "unknown" not in text.stdout + text.stderr, text.stdout
    apply = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "-b",
                       "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 4}}', env={"GPUOPS_BECOME_PASS": "not-it"})
    assert apply.returncode == 1, apply.stdout + apply.stderr
    assert (host.state_dir / "sglang.env").read_text() == env_before
    assert "sudo refused: wrong password" in apply.stdout + apply.stderr
    assert "not-it" not in inspect.stdout + inspect.stderr + text.stdout + text.stderr + apply.stdout + apply.stderr
