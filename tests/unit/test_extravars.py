"""-e/--extra-vars: k=v strings, inline YAML/JSON, @files; later values win."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.errors import GpuopsError
from gpuops.extravars import parse_extra_vars


def test_key_value_strings_stay_strings_like_ansible() -> None:
    assert parse_extra_vars(["sglang_port=30001 note='two words' empty="]) == {
        "sglang_port": "30001",
        "note": "two words",
        "empty": "",
    }


def test_inline_json_and_yaml_keep_types() -> None:
    assert parse_extra_vars(['{"sglang_port": 30001, "args": ["--tp", "8"]}']) == {
        "sglang_port": 30001,
        "args": ["--tp", "8"],
    }
    assert parse_extra_vars(["{become: false, env: {NCCL_ALGO: Ring}}"]) == {
        "become": False,
        "env": {"NCCL_ALGO": "Ring"},
    }


def test_files_and_override_order(tmp_path: Path) -> None:
    yml = tmp_path / "vars.yml"
    yml.write_text("a: 1\nb: from-yaml\nnested: {x: 1}\n", encoding="utf-8")
    js = tmp_path / "vars.json"
    js.write_text('{"b": "from-json", "nested": {"y": 2}}', encoding="utf-8")
    empty = tmp_path / "empty.yml"
    empty.write_text("", encoding="utf-8")
    merged = parse_extra_vars([f"@{yml}", f"@{js}", "a=cli", f"@{empty}", ""])
    # Later values override key by key; nested mappings are replaced, not merged (Ansible's default).
    assert merged == {"a": "cli", "b": "from-json", "nested": {"y": 2}}


def test_values_with_shell_syntax_are_only_text(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    assert parse_extra_vars([f"x='$(touch {marker})'"]) == {"x": f"$(touch {marker})"}
    assert not marker.exists()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("justaword", "'justaword'"),
        ("a=1 loose", "'loose'"),
        ("=value", "'=value'"),
        ("a='unclosed", "a='unclosed"),
        ("{a: [1", "'{a: [1'"),
        ("[1, 2]", "not a list"),
        ("@", "file name must follow"),
        ("1bad=x", "not a valid variable name"),
    ],
)
def test_errors_name_the_value(value: str, expected: str) -> None:
    with pytest.raises(GpuopsError) as caught:
        parse_extra_vars([value])
    message = str(caught.value)
    assert "\n" not in message
    assert expected in message


def test_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yml"
    with pytest.raises(GpuopsError, match=f"-e @{missing}: no such file"):
        parse_extra_vars([f"@{missing}"])
    bad = tmp_path / "bad.yml"
    bad.write_text("a: 1\nb: [oops\n", encoding="utf-8")
    with pytest.raises(GpuopsError, match=rf"{bad}:3:"):
        parse_extra_vars([f"@{bad}"])
    notmap = tmp_path / "list.json"
    notmap.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(GpuopsError, match=rf"-e @{notmap}: variables file must be a mapping"):
        parse_extra_vars([f"@{notmap}"])
