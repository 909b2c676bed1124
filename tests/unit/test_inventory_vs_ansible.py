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
from typing import Iterator

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


# ansible-inventory's command line imported once for the module (~0.4 of the ~0.55 CPU-s of a run),
# each run forked from that process: a child of its own per run (its argv, environment, stdout and
# exit status; Ansible's configuration as read at the import, from ANSIBLE_CONFIG / _HOME /
# _LOCAL_TEMP under the module's own temp dir: no ansible.cfg, nothing of the user's).
_FORK_SERVER = r"""
import json, os, select, signal, sys
from ansible.cli.inventory import InventoryCLI
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.environ.clear()
            os.environ.update(request["env"])
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for fd, path in ((1, request["out"]), (2, request["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            sys.argv = list(request["argv"])
            try:
                InventoryCLI.cli_executor(sys.argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    handle = os.pidfd_open(pid)
    if not select.select([handle], [], [], request["timeout"])[0]:
        os.kill(pid, signal.SIGKILL)
    os.close(handle)
    print(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])), flush=True)
"""


class AnsibleInventory:
    """``ansible-inventory ARGS`` runs, each forked from one process that imported its CLI (the
    python of the script's own shebang)."""

    def __init__(self, script: str, home: Path) -> None:
        python = Path(script).read_text(encoding="utf-8", errors="replace").splitlines()[0][2:].strip()
        self.script, self.home = script, home
        self.env = {**os.environ, "ANSIBLE_CONFIG": str(home / "none.cfg"), "ANSIBLE_LOCAL_TEMP": str(home / "t"),
                    "ANSIBLE_HOME": str(home / "ah")}
        self.server = subprocess.Popen([python, "-c", _FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, env=self.env, cwd=home)
        self.count = 0

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        self.count += 1
        out, err = self.home / f"{self.count}.out", self.home / f"{self.count}.err"
        assert self.server.stdin is not None and self.server.stdout is not None
        env = {**os.environ, **{k: v for k, v in self.env.items() if k.startswith("ANSIBLE_")}}
        self.server.stdin.write(json.dumps({"argv": [self.script, *args], "env": env, "out": str(out),
                                            "err": str(err), "timeout": timeout}) + "\n")
        self.server.stdin.flush()
        status = json.loads(self.server.stdout.readline())
        done = subprocess.CompletedProcess([self.script, *args], status, out.read_text(), err.read_text())
        if status == -9:
            raise subprocess.TimeoutExpired(done.args, timeout, done.stdout, done.stderr)
        return done

    def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        self.server.wait(30)


_ANSIBLE: list[AnsibleInventory] = []  # the module's, while its tests run


@pytest.fixture(scope="module", autouse=True)
def ansible_inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnsibleInventory]:
    assert ANSIBLE_INVENTORY is not None
    runner = AnsibleInventory(ANSIBLE_INVENTORY, tmp_path_factory.mktemp("ansible"))
    _ANSIBLE.append(runner)
    yield runner
    _ANSIBLE.remove(runner)
    runner.close()


def ansible_list(sources: list[Path], tmp_path: Path) -> str:
    args = []
    for source in sources:
        args += ["-i", str(source)]
    done = _ANSIBLE[0].run(*args, "--list")
    assert done.returncode == 0, done.stderr
    return done.stdout


def ansible_view(inventory: Path | list[Path], tmp_path: Path) -> tuple[dict[str, dict], dict[str, set[str]]]:
    data = json.loads(ansible_list(inventory if isinstance(inventory, list) else [inventory], tmp_path))
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


def gpuops_view(inventory: Path | list[Path]) -> tuple[dict[str, dict], dict[str, set[str]]]:
    sources = [str(p) for p in inventory] if isinstance(inventory, list) else str(inventory)
    loaded = load_inventory(sources)
    hostvars = {h.name: dict(h.vars) for h in loaded.hosts}
    members = {name: set(group.hosts) for name, group in loaded.groups.items() if group.hosts}
    return hostvars, members


def assert_same(inventory: Path | list[Path], tmp_path: Path) -> None:
    ours_vars, ours_members = gpuops_view(inventory)
    theirs_vars, theirs_members = ansible_view(inventory, tmp_path)
    for name in set(ours_vars) | set(theirs_vars):
        assert ours_vars.get(name) == theirs_vars.get(name, {}), name
    assert set(ours_vars) == theirs_members["all"]  # _meta.hostvars leaves out hosts without vars
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


SCRIPT_WITH_META = """\
#!/usr/bin/env python3
import json, sys
inventory = {
    "gpus": {"hosts": ["gpu01", "gpu02"], "vars": {"sglang_port": 30000, "level": "gpus"},
             "children": ["edge"]},
    "edge": ["edge01"],
    "fleet": {"children": ["gpus"], "vars": {"level": "fleet", "region": "eu"}},
    "_meta": {"hostvars": {"gpu01": {"ansible_host": "10.0.0.1", "level": "host"},
                           "edge01": {"ansible_port": 2222, "nested": {"a": [1, 2]}}}},
}
if sys.argv[1:] == ["--list"]:
    print(json.dumps(inventory))
else:
    sys.exit("unexpected arguments: %r" % sys.argv[1:])
"""

# No _meta: Ansible (and gpuops) ask `--host NAME` for each host; every call is logged.
SCRIPT_WITHOUT_META = """\
#!/usr/bin/env python3
import json, os, sys
with open(os.environ["SCRIPT_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:] == ["--list"]:
    print(json.dumps({"gpus": {"hosts": ["gpu01", "gpu02"], "vars": {"v": "group"}}}))
elif sys.argv[1] == "--host":
    print(json.dumps({"gpu01": {"ansible_host": "10.0.0.1", "v": "host"}}.get(sys.argv[2], {})))
"""


def write_script(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def test_inventory_script_with_meta_matches_ansible(tmp_path: Path) -> None:
    script = write_script(tmp_path / "inventory.py", SCRIPT_WITH_META)
    assert_same(script, tmp_path)


def test_inventory_script_without_meta_asks_host_by_host_like_ansible(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SCRIPT_LOG", str(tmp_path / "calls.log"))
    script = write_script(tmp_path / "inventory.py", SCRIPT_WITHOUT_META)
    assert_same(script, tmp_path)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls.count("--list") == 2  # once by Ansible, once by gpuops
    assert calls.count("--host gpu01") == 2 and calls.count("--host gpu02") == 2


def test_the_json_ansible_inventory_prints_reads_as_the_inventory_it_came_from(tmp_path: Path) -> None:
    source = tmp_path / "src"
    write(source / "hosts.yml", """
        all:
          vars: {level: all}
          children:
            gpus:
              vars: {level: gpus, sglang_port: 30000}
              hosts:
                gpu[01:02]: {ansible_host: 10.0.0.1}
            edge:
              hosts: {edge01: {ansible_port: 2222}}
        """)
    write(source / "group_vars" / "edge.yml", "level: edge-file\n")
    exported = tmp_path / "exported.json"
    exported.write_text(ansible_list([source], tmp_path), encoding="utf-8")
    ours_vars, ours_members = gpuops_view(exported)
    theirs_vars, theirs_members = ansible_view(source, tmp_path)
    assert ours_vars == theirs_vars
    for group, hosts in theirs_members.items():
        if hosts:
            assert ours_members.get(group) == hosts, group


def test_several_sources_merge_like_ansible(tmp_path: Path) -> None:
    first = tmp_path / "a" / "hosts.yml"
    write(first, """
        all:
          children:
            gpus:
              vars: {level: a}
              hosts: {gpu01: {x: 1}, gpu02: }
        """)
    write(tmp_path / "a" / "group_vars" / "gpus.yml", "from_a_dir: yes\n")
    second = tmp_path / "b" / "hosts.ini"
    write(second, """
        [gpus]
        gpu02 x=2
        gpu03
        [edge]
        edge01
        """)
    write(tmp_path / "b" / "host_vars" / "gpu03.yml", "from_b_dir: 3\n")
    assert_same([first, second], tmp_path)


def test_constructed_plugin_resolved_through_ansible_inventory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ANSIBLE_HOME", str(tmp_path / "ah"))
    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path / "t"))
    monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "none.cfg"))
    hosts = tmp_path / "hosts.yml"
    write(hosts, """
        all:
          hosts:
            gpu01: {gpu_kind: rtx6000, ansible_host: 10.0.0.1}
            gpu02: {gpu_kind: h200}
        """)
    constructed = tmp_path / "constructed.yml"
    write(constructed, """
        plugin: ansible.builtin.constructed
        strict: true
        groups:
          blackwell: gpu_kind == 'rtx6000'
        keyed_groups:
          - key: gpu_kind
            prefix: kind
        """)
    assert_same([hosts, constructed], tmp_path)
    loaded = load_inventory([str(hosts), str(constructed)])
    assert [h.name for h in loaded.select("blackwell")] == ["gpu01"]
    assert [h.name for h in loaded.select("kind_h200")] == ["gpu02"]
