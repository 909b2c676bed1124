"""Host keys through the CLI, each source of trust on its own: ~/.ssh/config's UserKnownHostsFile,
the inventory's gpuops_known_hosts, and --accept-new-host-keys end to end.

Every test runs gpuops as a user would (``python -m gpuops.cli`` with a HOME of its own) and gives it
exactly one file that vouches for the lab's keys, so a source that gpuops stopped reading fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory(gpu="h200-x1", sglang=None, server=False, count=2)


def _write_inventory(path: Path, hosts: dict) -> Path:
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


def _addressed(lab, **extra) -> dict:
    """Each lab host with its address, port, user and key, and nothing about host keys."""
    return {h.name: {"ansible_host": "127.0.0.1", "ansible_port": h.port, "ansible_user": _user(lab),
                     "ansible_ssh_private_key_file": str(lab.root / "client_key"), **extra} for h in lab.hosts}


def _user(lab) -> str:
    return yaml.safe_load(lab.inventory_path.read_text())["all"]["children"]["lab"]["hosts"][lab.hosts[0].name][
        "ansible_user"]


def _inspect(run_gpuops, inventory: Path, *flags: str):
    done = run_gpuops("inspect", "host", "-i", str(inventory), "--json", *flags, timeout=120)
    return done, json.loads(done.stdout)["hosts"] if done.stdout.strip().startswith("{") else {}


def _wrong_keys(lab, path: Path) -> None:
    """The lab's known_hosts lines with every key swapped for another host's key of the same type."""
    other = (lab.root / "client_key.pub").read_text().split()[:2]  # an ed25519 key that is not a host key
    lines = [f"{line.split()[0]} {other[0]} {other[1]}" for line in lab.known_hosts.read_text().splitlines() if line]
    path.write_text("\n".join(lines) + "\n")


def test_user_known_hosts_file_from_ssh_config_is_what_vouches(lab, run_gpuops, gpuops_home: Path,
                                                               tmp_path: Path) -> None:
    # Hosts known by name only: HostName, Port, User, IdentityFile and UserKnownHostsFile all come
    # from ~/.ssh/config (the lab's own client config); ~/.ssh/known_hosts does not exist. The file
    # is named as OpenSSH allows: quoted (a blank in the path), with %d, beside a second file.
    trusted = gpuops_home / "trusted keys" / "known_hosts"
    trusted.parent.mkdir()
    trusted.write_text(lab.known_hosts.read_text())
    config = lab.ssh_config.read_text().replace(f'"{lab.known_hosts}"', '"%d/trusted keys/known_hosts" ~/.ssh/other')
    assert config != lab.ssh_config.read_text()
    (gpuops_home / ".ssh" / "config").write_text(config)
    inventory = _write_inventory(tmp_path / "by-name.yml", {h.name: None for h in lab.hosts})
    done, hosts = _inspect(run_gpuops, inventory)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(hosts) == sorted(h.name for h in lab.hosts) and all(h["ok"] for h in hosts.values())
    assert not (gpuops_home / ".ssh" / "known_hosts").exists()

    # The same config naming a file whose keys are wrong: every host refused, key CHANGED.
    wrong = tmp_path / "wrong keys" / "known_hosts"
    wrong.parent.mkdir()
    _wrong_keys(lab, wrong)
    config = lab.ssh_config.read_text().replace(f'"{lab.known_hosts}"', f'"{wrong}"')
    assert config != lab.ssh_config.read_text()
    (gpuops_home / ".ssh" / "config").write_text(config)
    done, hosts = _inspect(run_gpuops, inventory)
    assert done.returncode == 1
    for name, line in hosts.items():
        assert not line["ok"] and "host key" in line["error"] and "CHANGED" in line["error"], (name, line)


def test_gpuops_known_hosts_alone_vouches(lab, run_gpuops, gpuops_home: Path, tmp_path: Path) -> None:
    inventory = _write_inventory(tmp_path / "inv.yml", _addressed(lab, gpuops_known_hosts=str(lab.known_hosts)))
    done, hosts = _inspect(run_gpuops, inventory)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(h["ok"] for h in hosts.values())
    assert sorted((gpuops_home / ".ssh").iterdir()) == []  # nothing read from or written to ~/.ssh

    wrong = tmp_path / "wrong_known_hosts"
    _wrong_keys(lab, wrong)
    inventory = _write_inventory(tmp_path / "inv-wrong.yml", _addressed(lab, gpuops_known_hosts=str(wrong)))
    done, hosts = _inspect(run_gpuops, inventory, "--accept-new-host-keys")  # never replaces a changed key
    assert done.returncode == 1
    assert all("host key" in h["error"] and "CHANGED" in h["error"] for h in hosts.values())
    assert wrong.read_text().count("\n") == len(lab.hosts)


def test_accept_new_host_keys_end_to_end(lab, run_gpuops, gpuops_home: Path, tmp_path: Path) -> None:
    inventory = _write_inventory(tmp_path / "inv.yml", _addressed(lab))
    known = gpuops_home / ".ssh" / "known_hosts"

    refused, hosts = _inspect(run_gpuops, inventory)  # unknown keys: refused, and nothing recorded
    assert refused.returncode == 1
    for name, line in hosts.items():
        assert not line["ok"] and "host key" in line["error"] and "unknown" in line["error"], (name, line)
        assert "--accept-new-host-keys" in line["error"]
    assert not known.exists() or known.read_text() == ""

    accepted, hosts = _inspect(run_gpuops, inventory, "--accept-new-host-keys")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    recorded = {tuple(line.split()[:3]) for line in known.read_text().splitlines() if line}
    assert recorded == {tuple(line.split()[:3]) for line in lab.known_hosts.read_text().splitlines() if line}

    verified, hosts = _inspect(run_gpuops, inventory)  # the recorded keys now vouch, without the flag
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert all(h["ok"] for h in hosts.values())
