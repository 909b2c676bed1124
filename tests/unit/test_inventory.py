"""Inventory loading: YAML and INI read as Ansible reads them, vars precedence, vars files, errors."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from gpuops.errors import GpuopsError, InventoryError
from gpuops.inventory import Host, Inventory, load_inventory


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


CLUSTER_YAML = """
all:
  vars:
    level: all
    only_all: 1
  hosts:
    lone:
  children:
    cluster:
      vars:
        level: cluster
        only_cluster: c
      children:
        gpus:
          vars:
            level: gpus
          hosts:
            gpu[01:03]:
              ansible_host: 10.0.0.1
              ansible_user: ops
            gpu04:2222:
    other:
      hosts:
        gpu01:
          extra: 7
"""

CLUSTER_INI = """
lone

[gpus]
gpu[01:03] ansible_host=10.0.0.1 ansible_user=ops
gpu04:2222

[cluster:children]
gpus

[cluster:vars]
level=cluster
only_cluster=c

[gpus:vars]
level=gpus

[all:vars]
level=all
only_all=1

[other]
gpu01 extra=7
"""


def summary(inventory: Inventory) -> list[tuple]:
    return [
        (h.name, h.address, h.port, h.user, h.key_file, h.connection, set(h.groups), dict(h.vars))
        for h in inventory.hosts
    ]


def test_yaml_and_ini_inventories_give_the_same_hosts_and_vars(tmp_path: Path) -> None:
    from_yaml = load_inventory(str(write(tmp_path / "y" / "inv.yml", CLUSTER_YAML)))
    from_ini = load_inventory(str(write(tmp_path / "i" / "inv.ini", CLUSTER_INI)))
    assert summary(from_yaml) == summary(from_ini)
    assert [h.name for h in from_yaml.hosts] == ["lone", "gpu01", "gpu02", "gpu03", "gpu04"]


def test_hosts_fields_groups_and_precedence(tmp_path: Path) -> None:
    inventory = load_inventory(str(write(tmp_path / "inv.yml", CLUSTER_YAML)))
    gpu01 = inventory.host("gpu01")
    assert gpu01 == Host(
        name="gpu01",
        address="10.0.0.1",
        port=None,
        user="ops",
        key_file=None,
        connection="ssh",
        groups=("all", "cluster", "other", "gpus"),
        vars=gpu01.vars,
    )
    # Deeper group wins over its parent, which wins over all; unrelated keys are kept.
    assert gpu01.vars["level"] == "gpus"
    assert gpu01.vars["only_cluster"] == "c"
    assert gpu01.vars["only_all"] == 1
    assert gpu01.vars["extra"] == 7
    gpu04 = inventory.host("gpu04")
    assert (gpu04.address, gpu04.port) == (None, 2222)
    lone = inventory.host("lone")
    assert lone.groups == ("all", "ungrouped")
    assert lone.vars["level"] == "all"
    assert inventory.groups["gpus"].depth == 2
    assert inventory.groups["cluster"].hosts == ("gpu01", "gpu02", "gpu03", "gpu04")


def test_host_vars_are_read_only(tmp_path: Path) -> None:
    host = load_inventory(str(write(tmp_path / "inv.yml", CLUSTER_YAML))).host("gpu01")
    with pytest.raises(TypeError):
        host.vars["level"] = "changed"  # type: ignore[index]


def test_host_line_vars_beat_group_vars_and_same_depth_groups_sort_by_name(tmp_path: Path) -> None:
    inventory = load_inventory(
        str(
            write(
                tmp_path / "inv.yml",
                """
                alpha:
                  vars: {v: alpha, w: alpha}
                  hosts: {h1: {w: host}}
                beta:
                  vars: {v: beta}
                  hosts: {h1: }
                """,
            )
        )
    )
    h1 = inventory.host("h1")
    assert h1.vars["v"] == "beta"  # same depth: later name wins, as Ansible sorts groups by name
    assert h1.vars["w"] == "host"


def test_vars_files_in_every_form_and_their_precedence(tmp_path: Path) -> None:
    inv = write(
        tmp_path / "inv.yml",
        """
        all:
          vars: {v: inline-all, a: inline-all}
          children:
            gpus:
              vars: {v: inline-gpus, g: inline-gpus}
              hosts:
                gpu01: {v: inline-host, h: inline-host}
                gpu02:
                gpu03:
        """,
    )
    write(tmp_path / "group_vars" / "all.yml", "a: file-all\nv: file-all\n")
    write(tmp_path / "group_vars" / "gpus" / "10-base.yaml", "g: file-gpus-dir\nz: 1\n")
    write(tmp_path / "group_vars" / "gpus" / "20-more.json", '{"z": 2}')
    write(tmp_path / "group_vars" / "gpus" / ".hidden.yml", "z: hidden\n")
    write(tmp_path / "host_vars" / "gpu01", "h: file-host\n")
    write(tmp_path / "host_vars" / "gpu02.json", '{"v": "file-host-json", "port": 1}')
    write(tmp_path / "host_vars" / "gpu03.yaml", "")  # an empty file is no variables
    inventory = load_inventory(str(inv))
    gpu01, gpu02, gpu03 = (inventory.host(n) for n in ("gpu01", "gpu02", "gpu03"))
    # group_vars files override inline group vars; inline host vars override group_vars files;
    # host_vars files override everything.
    assert gpu01.vars["a"] == "file-all"
    assert gpu01.vars["g"] == "file-gpus-dir"
    assert gpu01.vars["z"] == 2
    assert gpu01.vars["v"] == "inline-host"
    assert gpu01.vars["h"] == "file-host"
    assert gpu02.vars["v"] == "file-host-json"
    assert gpu03.vars["v"] == "file-all"


def test_directory_inventory_merges_files_and_reads_vars_beside(tmp_path: Path) -> None:
    write(tmp_path / "inv" / "10-gpus.yml", "gpus:\n  hosts:\n    gpu01:\n")
    write(tmp_path / "inv" / "20-more.ini", "[gpus]\ngpu02\n[edge]\nedge01 ansible_port=2200\n")
    write(tmp_path / "inv" / "README.md", "not an inventory [at all\n")
    write(tmp_path / "inv" / "group_vars" / "gpus.yml", "sglang_port: 30001\n")
    inventory = load_inventory(str(tmp_path / "inv"))
    assert [h.name for h in inventory.hosts] == ["gpu01", "gpu02", "edge01"]
    assert inventory.host("gpu02").vars["sglang_port"] == 30001
    assert inventory.host("edge01").port == 2200
    assert "sglang_port" not in inventory.host("edge01").vars


def test_ini_values_are_literals_like_ansible(tmp_path: Path) -> None:
    inventory = load_inventory(
        str(
            write(
                tmp_path / "hosts",  # no extension: sniffed as INI
                """
                # comment
                ; another comment
                [gpus]
                gpu01 n=8 flag=True word=true quoted="two words" items="['a', 'b']"  # trailing comment
                [gpus:vars]
                port=30000
                spaced = value with spaces
                """,
            )
        )
    )
    variables = inventory.host("gpu01").vars
    assert variables["n"] == 8
    assert variables["flag"] is True
    assert variables["word"] == "true"
    assert variables["quoted"] == "two words"
    assert variables["items"] == ["a", "b"]
    assert variables["port"] == 30000
    assert variables["spaced"] == "value with spaces"


def test_yaml_inventory_without_extension_is_sniffed(tmp_path: Path) -> None:
    inventory = load_inventory(str(write(tmp_path / "hosts", "all:\n  hosts:\n    a:\n")))
    assert [h.name for h in inventory.hosts] == ["a"]


def test_connection_vars_and_short_forms(tmp_path: Path) -> None:
    key = write(tmp_path / "keys" / "id_ed25519", "not really a key\n")
    inventory = load_inventory(
        str(
            write(
                tmp_path / "inv.yml",
                """
                all:
                  hosts:
                    short:
                      ansible_ssh_host: 192.0.2.5
                      ansible_ssh_port: "2022"
                      ansible_ssh_user: admin
                      ansible_ssh_private_key_file: keys/id_ed25519
                    here:
                      ansible_connection: local
                    localhost:
                """,
            )
        )
    )
    short = inventory.host("short")
    assert (short.address, short.port, short.user) == ("192.0.2.5", 2022, "admin")
    assert short.key_file == str(key)
    assert inventory.host("here").connection == "local"
    # A host named localhost is still reached over ssh unless the inventory says local.
    assert inventory.host("localhost").connection == "ssh"
    assert [h.name for h in inventory.select("short")] == ["short"]


def test_key_file_tilde_expands_to_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write(tmp_path / "home" / ".ssh" / "gpu", "k\n")
    inv = write(tmp_path / "inv.ini", "gpu01 ansible_ssh_private_key_file=~/.ssh/gpu\n")
    host = load_inventory(str(inv)).select(None)[0]
    assert host.key_file == str(tmp_path / "home" / ".ssh" / "gpu")


def test_missing_key_file_names_host_and_file(tmp_path: Path) -> None:
    inv = write(
        tmp_path / "inv.yml",
        "all:\n  hosts:\n    gpu01: {ansible_ssh_private_key_file: /nonexistent/key}\n    gpu02:\n",
    )
    inventory = load_inventory(str(inv))
    with pytest.raises(InventoryError) as caught:
        inventory.select(None)
    message = str(caught.value)
    assert "gpu01" in message and "/nonexistent/key" in message and "\n" not in message
    # A host left out by --limit does not block the others.
    assert [h.name for h in inventory.select("gpu02")] == ["gpu02"]


def test_no_inventory_means_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUOPS_INVENTORY", raising=False)
    inventory = load_inventory(None)
    assert [(h.name, h.connection, h.address) for h in inventory.select(None)] == [("localhost", "local", None)]
    assert [h.name for h in inventory.select("localhost")] == ["localhost"]


def test_inventory_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = write(tmp_path / "inv.ini", "[gpus]\ngpu07\n")
    monkeypatch.setenv("GPUOPS_INVENTORY", str(inv))
    assert [h.name for h in load_inventory(None).hosts] == ["gpu07"]


def test_comma_separated_host_list() -> None:
    inventory = load_inventory("gpu01,gpu02:2200,")
    assert [(h.name, h.port, h.connection) for h in inventory.hosts] == [
        ("gpu01", None, "ssh"),
        ("gpu02", 2200, "ssh"),
    ]


def test_ranges_letters_strides_and_padding(tmp_path: Path) -> None:
    inventory = load_inventory(
        str(write(tmp_path / "inv.ini", "[a]\nnode-[a:c]\n[b]\nx[08:10]\n[c]\ny[1:7:3]\n"))
    )
    assert [h.name for h in inventory.hosts] == ["node-a", "node-b", "node-c", "x08", "x09", "x10", "y1", "y4", "y7"]


def test_hostile_host_name_is_only_a_name(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker})"
    inv_yaml = write(tmp_path / "inv.yml", f"all:\n  hosts:\n    '{hostile}':\n      note: '`touch {marker}`'\n")
    inv_ini = write(tmp_path / "inv.ini", f"'{hostile}' note='`touch {marker}`'\n")
    for inv in (inv_yaml, inv_ini):
        inventory = load_inventory(str(inv))
        assert [h.name for h in inventory.select(None)] == [hostile]
        assert inventory.host(hostile).vars["note"] == f"`touch {marker}`"
    # INI literals go through ast.literal_eval, which evaluates nothing.
    inv_eval = write(tmp_path / "eval.ini", f"h x=__import__('os').system('touch {marker}')\n")
    assert load_inventory(str(inv_eval)).host("h").vars["x"].startswith("__import__")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# Errors: one line, naming the file (and the line where there is one). Nothing half-loaded.


def error_for(tmp_path: Path, name: str, text: str) -> tuple[str, Path]:
    path = write(tmp_path / name, text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path)).select(None)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    assert isinstance(caught.value, GpuopsError)
    return message, path


def test_error_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    message, path = error_for(tmp_path, "inv.yml", "all:\n  hosts:\n    a: [1, 2\n    b:\n")
    assert f"{path}:4:" in message and "malformed YAML" in message


def test_error_malformed_ini(tmp_path: Path) -> None:
    message, path = error_for(tmp_path, "inv.ini", "[gpus]\ngpu01 novalue\n")
    assert f"{path}:2:" in message and "key=value" in message
    message, path = error_for(tmp_path, "bad-section.ini", "[gpus:bogus]\ngpu01\n")
    assert f"{path}:1:" in message and "unknown type" in message
    message, path = error_for(tmp_path, "bad-vars.ini", "[gpus]\ngpu01\n[gpus:vars]\njustaword\n")
    assert f"{path}:4:" in message
    message, path = error_for(tmp_path, "bad-header.ini", "[gpus\ngpu01\n")
    assert f"{path}:1:" in message and "section header" in message
    message, path = error_for(tmp_path, "undefined.ini", "[nothere:vars]\na=1\n")
    assert "never defined" in message
    message, path = error_for(tmp_path, "quote.ini", "gpu01 a='open\n")
    assert f"{path}:1:" in message


def test_error_non_mappings_where_mappings_belong(tmp_path: Path) -> None:
    message, _ = error_for(tmp_path, "list.yml", "- gpu01\n- gpu02\n")
    assert "mapping" in message
    message, _ = error_for(tmp_path, "hostslist.yml", "all:\n  hosts:\n    - gpu01\n")
    assert "hosts of group 'all' must be a mapping" in message
    message, _ = error_for(tmp_path, "hostvars.yml", "all:\n  hosts:\n    gpu01: 10.0.0.1\n")
    assert "gpu01" in message
    message, _ = error_for(tmp_path, "groupvars.yml", "gpus:\n  vars: [1]\n  hosts: {a: }\n")
    assert "vars of group 'gpus'" in message
    message, _ = error_for(tmp_path, "empty.yml", "")
    assert "empty" in message


def test_error_unknown_structure(tmp_path: Path) -> None:
    message, path = error_for(tmp_path, "inv.yml", "all:\n  hosts: {}\n  gpu01:\n    ansible_host: x\n")
    assert "unexpected key 'gpu01'" in message and f"{path}:3:" in message
    message, _ = error_for(tmp_path, "plugin.yml", "plugin: aws_ec2\n")
    assert "plugin" in message


def test_error_bad_vars_file_names_that_file(tmp_path: Path) -> None:
    inv = write(tmp_path / "inv.yml", "gpus:\n  hosts: {gpu01: }\n")
    bad = write(tmp_path / "group_vars" / "gpus.yml", "- not\n- a mapping\n")
    with pytest.raises(InventoryError, match=str(bad)):
        load_inventory(str(inv))
    bad.unlink()
    bad_json = write(tmp_path / "host_vars" / "gpu01.json", '{"a": }')
    with pytest.raises(InventoryError, match=rf"{bad_json}:1:"):
        load_inventory(str(inv))


def test_error_missing_inventory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(InventoryError, match=f"{missing}: no such inventory"):
        load_inventory(str(missing))


def test_error_ports_that_are_not_integers(tmp_path: Path) -> None:
    message, _ = error_for(tmp_path, "inv.yml", "all:\n  hosts:\n    gpu01: {ansible_port: twenty}\n")
    assert "gpu01" in message and "ansible_port 'twenty' is not an integer" in message
    message, _ = error_for(tmp_path, "inv.ini", "gpu01 ansible_port=99999\n")
    assert "out of range" in message
    message, _ = error_for(tmp_path, "bool.yml", "all:\n  hosts:\n    gpu01: {ansible_port: true}\n")
    assert "not an integer" in message


def test_error_bad_ranges_and_connections(tmp_path: Path) -> None:
    message, _ = error_for(tmp_path, "r.ini", "[g]\ngpu[08:01]\n")
    assert "ends before it starts" in message
    message, _ = error_for(tmp_path, "w.ini", "[g]\ngpu[01:100]\n")
    assert "same number of digits" in message
    message, _ = error_for(tmp_path, "c.yml", "all:\n  hosts:\n    w: {ansible_connection: winrm}\n")
    assert "winrm" in message and "not supported" in message


def test_error_group_loop(tmp_path: Path) -> None:
    message, _ = error_for(tmp_path, "loop.ini", "[a:children]\nb\n[b:children]\na\n")
    assert "loop" in message


def test_error_bad_yaml_vars_file_points_at_line(tmp_path: Path) -> None:
    inv = write(tmp_path / "inv.yml", "gpus:\n  hosts: {gpu01: }\n")
    bad = write(tmp_path / "group_vars" / "all", "a: 1\nb: [unclosed\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(inv))
    assert str(caught.value).startswith(f"{bad}:")
    assert os.fspath(bad) + ":3:" in str(caught.value) or os.fspath(bad) + ":2:" in str(caught.value)
