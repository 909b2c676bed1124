"""The entrypoint probe on real installs of real SGLang releases (their wheels from the release cache,
installed by pip as an operator would: into a venv, or with --target): which one the launch uses.

The releases are installed without their dependencies (``--no-deps``): what is read is the release's
own files and the script its installer wrote, and nothing is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.apply.probes import entrypoints_probe
from gpuops.gather import gather
from gpuops.inventory import Host
from gpuops.lab.sglang_cache import sglang_site, sglang_wheel
from gpuops.transport.local import LocalConnection

pytestmark = pytest.mark.integration


def _pip_install(wheel: Path, *where: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *where[:2], "install", "-q", "--no-deps", "--no-index", "--no-compile",
                    "--disable-pip-version-check", *where[2:], str(wheel)], check=True, timeout=600)


def _venv_with(version: str, root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    _pip_install(sglang_wheel(version), "--python", str(python))
    return python


def _read(pythons: tuple[str, ...], desired: str | None = None, isolated: bool = False) -> dict:
    conn = LocalConnection(Host(name="h", address=None, port=None, user=None, key_file=None, groups=(),
                                connection="local"))
    return gather(conn, [entrypoints_probe(pythons, desired, isolated)])["apply.entrypoints"]


def test_each_install_launches_as_its_release_recommends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new = _venv_with("0.5.16", tmp_path / "v16")
    old = _venv_with("0.5.8", tmp_path / "v08")
    target = tmp_path / "target"  # pip --target: the release's files, no script
    _pip_install(sglang_wheel("0.5.16"), "--python", str(new), "--target", str(target))
    wrapper = tmp_path / "python-target"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={target} exec {new} \"$@\"\n")
    wrapper.chmod(0o755)
    # The release environment a standing sglang-release run launches from is named in desired.json only,
    # with its launch's empty PYTHONPATH; the gather's own points at another release (0.5.8's site, as a
    # lab host's or a login's would): that environment is asked without it, as it launches.
    desired = tmp_path / "desired.json"
    desired.write_text(json.dumps({"schema": 1, "contributions": {"sglang-release": {
        "python": str(new), "env": {"PYTHONPATH": ""}}}}))
    monkeypatch.setenv("PYTHONPATH", str(sglang_site("0.5.8")))

    found = _read((str(old), str(wrapper), str(tmp_path / "absent" / "python")), str(desired))
    assert found[str(new)].words == (str(tmp_path / "v16" / "bin" / "sglang"), "serve"), found[str(new)]
    assert found[str(old)].words == ("-m", "sglang.launch_server")
    assert "does not recommend" in found[str(old)].why
    assert found[str(wrapper)].words == ("-m", "sglang.launch_server")
    assert "wrote no `sglang` script" in found[str(wrapper)].why, found[str(wrapper)]
    assert str(tmp_path / "absent" / "python") not in found  # not there: not read (launch_server, unread)
    # The gather's PYTHONPATH is what a listed python sees (0.5.8 first); the re-read of a release
    # environment built during the run (isolated) sees its own release only.
    assert _read((str(new),))[str(new)].words == ("-m", "sglang.launch_server")
    assert _read((str(new),), isolated=True)[str(new)].words == (str(tmp_path / "v16" / "bin" / "sglang"), "serve")
    # The gather's python asked about itself (the host's chosen python is most often the server's own)
    # answers in its own process, and says what a second start of it would: the same two answers.
    monkeypatch.setenv("GPUOPS_PY", str(new))
    assert _read((str(new),))[str(new)].words == ("-m", "sglang.launch_server")
    assert _read((str(new),), isolated=True)[str(new)].words == (str(tmp_path / "v16" / "bin" / "sglang"), "serve")
