"""The private dockerd whose images are kept across runs (``gpuops.lab.dockerd.kept_dockerd``).

Each test keeps its daemon's data root in a cache of its own (never the user's, which the session's
``docker_daemon`` may hold) and images made from a one-file tar, so a daemon start is the cost.
``docker_usable`` skips where no dockerd can run; the session's ``docker_daemon`` is not started (it
would hold a slot of the user's cache that a concurrent run of the docker tests then goes without).
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from gpuops.lab.dockerd import DockerDaemon, KEEP_DAYS, keep_image, kept_dockerd
from gpuops.lab.processes import terminate

pytestmark = pytest.mark.integration


def import_tiny_image(daemon: DockerDaemon, tag: str) -> str:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo("hello")
        member.size = 3
        tar.addfile(member, io.BytesIO(b"hi\n"))
    done = daemon.run("import", "-", tag, input=archive.getvalue())
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().strip()


def tags(daemon: DockerDaemon) -> set[str]:
    done = daemon.run("images", "--format", "{{.Repository}}:{{.Tag}}")
    assert done.returncode == 0, done.stderr
    return set(done.stdout.decode().split())


def listed(daemon: DockerDaemon, *what: str) -> list[str]:
    done = daemon.run(*what, "-q")
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().split()


def mounts_under(directory: Path) -> list[str]:
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    return [p for p in points if p == str(directory) or p.startswith(f"{directory}/")]


def test_the_next_run_finds_the_kept_images_and_nothing_else_a_killed_run_left(docker_usable, tmp_path_factory) -> None:
    cache = tmp_path_factory.mktemp("kept-cache")
    with kept_dockerd(tmp_path_factory.mktemp("kd"), cache) as first:
        assert first.data_root == cache / "slot-0" / "data"
        kept_id = import_tiny_image(first, "gpuops-test/kept:1")
        keep_image(first, "gpuops-test/kept:1")
        import_tiny_image(first, "gpuops-test/unmarked:1")  # as a build cut short before its mark
        import_tiny_image(first, "gpuops-test/stale:1")
        keep_image(first, "gpuops-test/stale:1")
        long_ago = time.time() - (KEEP_DAYS + 1) * 86400
        os.utime(cache / "slot-0" / "kept" / quote("gpuops-test/stale:1", safe=""), (long_ago, long_ago))
        assert first.run("create", "--name", "left-over", "gpuops-test/kept:1", "/hello").returncode == 0
        assert first.run("volume", "create", "left-over").returncode == 0
        # The run is killed: its daemon gets SIGTERM and shuts down, keeping its containers.
        assert terminate(first.pid, 30)
    with kept_dockerd(tmp_path_factory.mktemp("kd"), cache) as second:
        assert second.data_root == first.data_root
        assert tags(second) == {"gpuops-test/kept:1"}
        assert second.run("image", "inspect", "-f", "{{.Id}}", "gpuops-test/kept:1").stdout.decode().strip() == kept_id
        assert listed(second, "ps", "-a") == []
        assert listed(second, "volume", "ls") == []
        assert sorted(p.name for p in (cache / "slot-0" / "kept").iterdir()) == [quote("gpuops-test/kept:1", safe="")]
    assert mounts_under(cache) == []  # the kept root is left as files only


def test_a_run_that_finds_the_slots_held_gets_a_fresh_data_root(docker_usable, tmp_path_factory) -> None:
    cache = tmp_path_factory.mktemp("kept-cache")
    with kept_dockerd(tmp_path_factory.mktemp("kd"), cache, slots=1) as holder:
        import_tiny_image(holder, "gpuops-test/kept:1")
        keep_image(holder, "gpuops-test/kept:1")
        workdir = tmp_path_factory.mktemp("kd")
        with kept_dockerd(workdir, cache, slots=1) as other:
            assert other.kept is None
            assert other.data_root == workdir / "data"
            assert tags(other) == set()
            keep_image(other, "gpuops-test/other:1")  # nothing to keep: its images go with it
        assert sorted(p.name for p in (cache / "slot-0" / "kept").iterdir()) == [quote("gpuops-test/kept:1", safe="")]
        assert tags(holder) == {"gpuops-test/kept:1"}


def test_a_data_root_the_daemon_cannot_start_on_is_made_afresh(docker_usable, tmp_path_factory) -> None:
    cache = tmp_path_factory.mktemp("kept-cache")
    slot = cache / "slot-0"
    (slot / "kept").mkdir(parents=True)
    (slot / "data").mkdir()
    (slot / "data" / "containers").write_text("not a directory\n")  # where dockerd keeps its containers
    (slot / "kept" / quote("gpuops-test/gone:1", safe="")).touch()  # its image went with the old root
    with kept_dockerd(tmp_path_factory.mktemp("kd"), cache) as daemon:
        assert daemon.data_root == slot / "data"
        assert Path(daemon.data_root).is_dir()
        assert daemon.kept == slot / "kept"
        assert tags(daemon) == set()
        assert list((slot / "kept").iterdir()) == []
    assert mounts_under(cache) == []  # nor what the failed start left mounted
