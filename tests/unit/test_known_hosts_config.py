"""UserKnownHostsFile values as OpenSSH reads them (the CLI tests drive the same through real sshd)."""

from __future__ import annotations

import getpass
from pathlib import Path

from gpuops.transport.known_hosts_config import user_known_hosts_files

CONFIG = {"hostname": "10.0.0.7", "port": "2222", "user": "ops"}


def test_several_files_quotes_and_tokens(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    value = '"%d/my keys/known_hosts" ~/.ssh/kh-%h-%p %%r-%r-%n-%u'
    assert user_known_hosts_files(value, CONFIG, "gpu-a") == [
        f"{tmp_path}/my keys/known_hosts", f"{tmp_path}/.ssh/kh-10.0.0.7-2222", f"%r-ops-gpu-a-{getpass.getuser()}"]


def test_one_quoted_path_with_a_blank_arrives_unquoted_and_stays_one_file(tmp_path: Path) -> None:
    path = tmp_path / "a b" / "known_hosts"
    path.parent.mkdir()
    path.write_text("")
    assert user_known_hosts_files(str(path), CONFIG, "gpu-a") == [str(path)]
    assert user_known_hosts_files(f"{tmp_path}/x {tmp_path}/y", CONFIG, "gpu-a") == [f"{tmp_path}/x", f"{tmp_path}/y"]


def test_an_unknown_token_is_left_as_written() -> None:
    assert user_known_hosts_files("/k/%Z", CONFIG, "a") == ["/k/%Z"]
