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


def test_a_daemon_that_does_not_answer_in_time_is_not_yet_up(tmp_path: Path) -> None:
    silent = tmp_path / "docker"
    silent.write_text("#!/bin/sh\nexec sleep 30\n")
    silent.chmod(0o755)
    daemon = DockerDaemon(dir=tmp_path, pid=0, socket=tmp_path / "docker.sock", cli_path=str(silent),
                          storage_driver="vfs", data_root=tmp_path / "data")
    started = time.monotonic()
    assert _answers(daemon, timeout=0.3) is False
    assert time.monotonic() - started < 5  # the silent client was killed at the timeout, not waited for


def test_a_daemon_that_answers_is_up(tmp_path: Path) -> None:
    answering = tmp_path / "docker"
    answering.write_text("#!/bin/sh\necho 20.10.24\n")
    answering.chmod(0o755)
    daemon = DockerDaemon(dir=tmp_path, pid=0, socket=tmp_path / "docker.sock", cli_path=str(answering),
                          storage_driver="vfs", data_root=tmp_path / "data")
    assert _answers(daemon) is True
