"""The same inventories through gpuops and through Ansible's own `ansible-inventory --list`.

ansible-core is part of the test extras (pyproject.toml), so it sits beside this python; the
benchmarks' venv (~/.cache/gpuops/bench-venv) or PATH also serve. Without it the tests skip, and the
skip policy (tests/conftest.py) fails the run: the comparison is never silently left out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuops.inventory import load_inventory


def _ansible_inventory() -> str | None:
    beside = Path(sys.executable).parent / "ansible-inventory"  # the test extras' ansible-core
    venv = Path(os.environ.get("GPUOPS_BENCH_VENV", "~/.cache/gpuops/bench-venv")).expanduser()
    for candidate in (beside, venv / "bin" / "ansible-inventory"):
        if candidate.exists():
            return str(candidate)
    return shutil.which("ansible-inventory")


ANSIBLE_INVENTORY = _ansible_inventory()
pytestmark = pytest.mark.skipif(ANSIBLE_INVENTORY is None, reason="ansible-inventory not installed")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def ansible_view(inventory: Path, tmp_path: Path) -> tuple[dict[str, dict], dict[str, set[str]]]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(tmp_path / "none.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "t"),
           "ANSIBLE_HOME": str(tmp_path / "ah")}
    done = subprocess.run([ANSIBLE_INVENTORY, "-i", str(inventory), "--list"], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    data = json.loads(done.stdout)
    hostvars = data.pop("_meta")["hostvars"]
    members: dict[str, set[str]] = {}

    def walk(group: str) -> set[str]:
        found = set(data.get(group, {}).get("hosts", []))
        for child in data.get(group, {}).get("children", []):
            found |= walk(child)
        return found

    for group in data:
        members[group] = walk(group)
    return hostvars, members


def gpuops_view(inventory: Path) -> tuple[dict[str, dict], dict[str, set[str]]]:
    loaded = load_inventory(str(inventory))
    hostvars = {h.name: dict(h.vars) for h in loaded.hosts}
    members = {name: set(group.hosts) for name, group in loaded.groups.items() if group.hosts}
    return hostvars, members


def assert_same(inventory: Path, tmp_path: Path) -> None:
    ours_vars, ours_members = gpuops_view(inventory)
    theirs_vars, theirs_members = ansible_view(inventory, tmp_path)
    for name in set(ours_vars) | set(theirs_vars):
        assert ours_vars.get(name) == theirs_vars.get(name, {}), name
    assert set(ours_vars) == set(theirs_vars)
    for group, hosts in theirs_members.items():
        if hosts:
            assert ours_members.get(group) == hosts, group


def test_nested_yaml_with_vars_files_matches_ansible(tmp_path: Path) -> None:
    write(
        tmp_path / "inv.yml",
        """
        all:
          vars: {v: all, a: all, n: 1}
          hosts:
            lone:
          children:
            cluster:
              vars: {v: cluster, c: cluster}
              children:
                gpus:
                  vars: {v: gpus}
                  hosts:
                    gpu[01:03]: {ansible_host: 10.0.0.1}
                    gpu04:2222:
            alpha:
              vars: {s: alpha, v: alpha}
              hosts: {gpu02: {h: inline}}
            beta:
              vars: {s: beta}
              hosts: {gpu02: , gpu03: }
        """,
    )
    write(tmp_path / "group_vars" / "all.yml", "a: file-all\n")
    write(tmp_path / "group_vars" / "gpus" / "main.yml", "g: file-gpus\nv: file-gpus\n")
    write(tmp_path / "group_vars" / "alpha.json", '{"s": "file-alpha"}')
    write(tmp_path / "host_vars" / "gpu02.yaml", "h: file-host\n")
    write(tmp_path / "host_vars" / "gpu03", "v: file-host3\n")
    assert_same(tmp_path / "inv.yml", tmp_path)


def test_ini_with_children_vars_and_literals_matches_ansible(tmp_path: Path) -> None:
    write(
        tmp_path / "hosts.ini",
        """
        lone ansible_port=2200
        [gpus]
        gpu[01:04] ansible_user=ops n=8 flag=True word=true quoted="two words" lst="[1, 2]"
        node-[a:c].lab
        [edge]
        edge01 ansible_host=192.0.2.1 x='$(touch /tmp/never)'
        [fleet:children]
        gpus
        edge
        [fleet:vars]
        level=fleet
        port=30000
        [gpus:vars]
        level=gpus
        spaced = has spaces
        [all:vars]
        level=all
        """,
    )
    assert_same(tmp_path / "hosts.ini", tmp_path)
