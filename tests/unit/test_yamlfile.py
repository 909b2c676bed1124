"""gpuops' one YAML loader (``gpuops.yamlfile``): every kind of file it reads says file:line:column
for malformed YAML in one line, the inventory's ``!vault`` and Ansible's ``!unsafe`` keep working,
and nothing else in ``src`` loads YAML by itself."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

import gpuops
from gpuops.errors import GpuopsError, InventoryError
from gpuops.extravars import parse_extra_vars
from gpuops.gates.catalog import load_catalog
from gpuops.inventory import load_inventory
from gpuops.inventory.vault import EncryptedValue
from gpuops.inventory.yamlfile import load_yaml_file as load_inventory_file
from gpuops.lab.gpu_description import load_description
from gpuops.plan.roles import load_role, project_root
from gpuops.yamlfile import MarkedDict, parse_yaml_text, plain

BROKEN = "a: 1\nb: [1, 2\nc: 3\n"  # the unclosed list is found at line 3


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


def test_every_file_kind_names_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(BROKEN)
    where = re.escape(str(bad)) + r":3:\d+: malformed YAML: "
    with pytest.raises(InventoryError) as exc:
        load_inventory(str(bad))
    assert re.match(where, one_line(exc))
    with pytest.raises(GpuopsError) as exc:
        parse_extra_vars([f"@{bad}"])
    assert re.match("-e @" + where, one_line(exc))
    with pytest.raises(GpuopsError) as exc:
        load_catalog(bad)
    assert re.match(where, one_line(exc))
    with pytest.raises(GpuopsError) as exc:
        load_description(str(bad))
    assert re.match(where, one_line(exc))
    role = tmp_path / "roles" / "broken"
    role.mkdir(parents=True)
    (role / "tasks.yml").write_text(BROKEN)
    with pytest.raises(GpuopsError) as exc:
        load_role("broken", [tmp_path / "roles"])
    assert re.match(re.escape(str(role / "tasks.yml")) + r":3:\d+: malformed YAML: ", one_line(exc))
    with pytest.raises(GpuopsError) as exc:
        parse_extra_vars(['{"a": [1, 2}'])
    assert re.match(r"-e .*:1:\d+: malformed YAML: ", one_line(exc))


def test_vault_tags_are_the_inventory_s_only(tmp_path: Path) -> None:
    text = "token: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n"
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(text)
    value = load_inventory_file(str(vars_file))["token"]
    assert isinstance(value, EncryptedValue) and value.where == f"{vars_file}:1"
    role = tmp_path / "roles" / "r"
    role.mkdir(parents=True)
    (role / "tasks.yml").write_text("- name: x\n  fail:\n    msg: !vault |\n      abc\n")
    with pytest.raises(GpuopsError) as exc:
        load_role("r", [tmp_path / "roles"])
    assert re.match(re.escape(str(role / "tasks.yml")) + r":3:\d+: malformed YAML: .*'!vault'", one_line(exc))


def test_unsafe_is_the_plain_value_and_marks_give_lines() -> None:
    data = parse_yaml_text(textwrap.dedent("""\
        a: !unsafe "{{ not templated }}"
        b:
          c: [1, 2]
          d: !unsafe [x, y]
        """), "f.yml", marks=True)
    assert plain(data) == {"a": "{{ not templated }}", "b": {"c": [1, 2], "d": ["x", "y"]}}
    assert isinstance(data, MarkedDict) and data.line == 1 and data.key_lines == {"a": 1, "b": 2}
    assert data["b"].line == 3 and data["b"].key_lines["d"] == 4
    assert type(parse_yaml_text("a: {b: 1}", "f.yml")["a"]) is dict  # no marks unless asked


@pytest.mark.parametrize("path", [
    project_root() / "src/gpuops/gates/catalog.yaml",
    *sorted((project_root() / "roles").glob("*/*.yml")),
])
def test_the_files_that_ship_read_as_safe_load_reads_them(path: Path) -> None:
    text = path.read_text()
    assert plain(parse_yaml_text(text, path, marks=True)) == yaml.safe_load(text) == parse_yaml_text(text, path)


def test_nothing_else_in_src_loads_yaml() -> None:
    """One loader: a new ``yaml.load``/``safe_load`` elsewhere in ``src`` fails here."""
    src = Path(gpuops.__file__).parent
    # The lab's docker host rewrites the inventory the lab itself just wrote (no user file, no
    # line to report): left to its owner.
    allowed = {"yamlfile.py", "lab/docker_host.py"}
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = str(path.relative_to(src))
        if rel in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"yaml\.(safe_)?load\(|yaml\.(C?Safe)?Loader\b|CSafeLoader", line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, found
