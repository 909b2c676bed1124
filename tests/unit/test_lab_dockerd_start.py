"""The lab's dockerd start asks until its deadline (gpuops.lab.dockerd).

dockerd makes its socket before it serves it: at the start of a whole run (its data root kept) the
API listened 11.5 s after the socket appeared, and a `docker version` that connected in between
waited past its 10 s. That timeout used to escape the start's poll loop and fail all 28 tests of
tests/integration/managers; it is "not yet" now. The CLI here is a real program that never answers.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuops.lab.dockerd import DockerDaemon, _answers


def daemon_with_cli(tmp_path: Path, script: str) -> DockerDaemon:
    """A DockerDaemon record whose `docker` CLI is the shell ``script`` (no dockerd behind it)."""
    cli = tmp_path / "docker"
    cli.write_text("#!/bin/sh\n" + script + "\n")
    cli.chmod(0o755)
    return DockerDaemon(dir=tmp_path, pid=0, socket=tmp_path / "docker.sock", cli_path=str(cli),
                        storage_driver="vfs", data_root=tmp_path / "data")


def test_a_daemon_that_does_not_answer_in_time_is_not_yet_up(tmp_path: Path) -> None:
    daemon = daemon_with_cli(tmp_path, "exec sleep 30")
    started = time.monotonic()
    assert _answers(daemon, timeout=0.3) is False
    assert time.monotonic() - started < 5  # the silent client was killed at the timeout, not waited for


def test_a_daemon_that_answers_is_up(tmp_path: Path) -> None:
    assert _answers(daemon_with_cli(tmp_path, "echo 20.10.24")) is True
