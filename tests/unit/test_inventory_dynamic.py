"""Inventory scripts and plugin files: how they fail (the happy paths are held equal to Ansible in
test_inventory_vs_ansible.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.errors import InventoryError
from gpuops.inventory import dynamic, load_inventory


def script(tmp_path: Path, body: str, name: str = "inventory.sh") -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(0o755)
    return path


def error(source: object) -> str:
    with pytest.raises(InventoryError) as caught:
        load_inventory(source)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_failing_script_names_itself_and_its_last_stderr_line(tmp_path: Path) -> None:
    path = script(tmp_path, "echo 'connecting to cmdb' >&2\necho 'cmdb: 401 unauthorized' >&2\nexit 3\n")
    assert error(str(path)) == f"inventory script {path} --list failed (exit status 3): cmdb: 401 unauthorized"


def test_a_script_that_prints_no_json_and_one_that_hangs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = script(tmp_path, "echo 'password=hunter2 not json'\n")
    message = error(str(path))
    assert message.startswith(f"inventory script {path} --list did not print a JSON document")
    assert "hunter2" not in message  # stdout is never echoed
    monkeypatch.setenv(dynamic.TIMEOUT_ENV, "0.5")
    slow = script(tmp_path, "exec sleep 30\n", "slow.sh")
    assert error(str(slow)) == f"inventory script {slow} --list did not finish within 0.5 s ($GPUOPS_INVENTORY_TIMEOUT sets the limit)"
    monkeypatch.setenv(dynamic.TIMEOUT_ENV, "soon")
    assert "must be a positive number of seconds" in error(str(slow))


def test_script_json_of_the_wrong_shape(tmp_path: Path) -> None:
    path = script(tmp_path, """echo '{"gpus": {"hosts": "gpu01"}}'\n""")
    assert error(str(path)) == f"inventory script {path}: the hosts of group 'gpus' must be a list of host names"


def test_an_executable_file_without_a_shebang_is_still_read_as_a_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text("[gpus]\ngpu01\n")
    path.chmod(0o755)
    assert [h.name for h in load_inventory(str(path)).hosts] == ["gpu01"]


def test_a_plugin_file_without_ansible_names_the_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamic, "ansible_inventory_command", lambda: None)
    path = tmp_path / "aws_ec2.yml"
    path.write_text("plugin: amazon.aws.aws_ec2\nregions: [eu-west-1]\n")
    message = error(str(path))
    assert message.startswith(f"{path}: inventory plugin 'amazon.aws.aws_ec2': that is Ansible's own code; install ansible-core")


def test_a_plugin_ansible_cannot_load_fails_with_ansibles_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if dynamic.ansible_inventory_command() is None:
        pytest.skip("ansible-inventory not installed")
    monkeypatch.setenv("ANSIBLE_HOME", str(tmp_path / "ah"))
    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path / "t"))
    path = tmp_path / "cloud.yml"
    path.write_text("plugin: example.nowhere.cloud\n")
    message = error(str(path))
    assert message.startswith("ansible-inventory (") and "example.nowhere.cloud" in message
