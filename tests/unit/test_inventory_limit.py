"""--limit patterns as Ansible reads them, and the errors when they match nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.errors import InventoryError
from gpuops.inventory import Inventory, load_inventory

INVENTORY = """
[gpus]
gpu[01:08]

[edge]
edge01
edge02

[canary]
gpu01
gpu05

[fleet:children]
gpus
edge
"""


@pytest.fixture()
def inventory(tmp_path: Path) -> Inventory:
    path = tmp_path / "inv.ini"
    path.write_text(INVENTORY, encoding="utf-8")
    return load_inventory(str(path))


def names(inventory: Inventory, limit: str | None) -> list[str]:
    return [h.name for h in inventory.select(limit)]


GPUS = [f"gpu0{i}" for i in range(1, 9)]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, [*GPUS, "edge01", "edge02"]),
        ("all", [*GPUS, "edge01", "edge02"]),
        ("*", [*GPUS, "edge01", "edge02"]),
        ("gpu03", ["gpu03"]),
        ("edge", ["edge01", "edge02"]),
        ("fleet", [*GPUS, "edge01", "edge02"]),
        ("gpu0[1-3]", ["gpu01", "gpu02", "gpu03"]),
        ("edge*", ["edge01", "edge02"]),
        ("gpu02:edge01", ["gpu02", "edge01"]),
        ("edge01,gpu02", ["gpu02", "edge01"]),  # inventory order, not pattern order
        ("gpus:&canary", ["gpu01", "gpu05"]),
        ("gpus:!canary", ["gpu02", "gpu03", "gpu04", "gpu06", "gpu07", "gpu08"]),
        ("!gpus", ["edge01", "edge02"]),
        ("fleet:!gpus:!edge02", ["edge01"]),
        ("~gpu0[1-4]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("~(gpu08|edge.*)", ["gpu08", "edge01", "edge02"]),
        ("gpus[0]", ["gpu01"]),
        ("gpus[-1]", ["gpu08"]),
        ("gpus[1:3]", ["gpu02", "gpu03", "gpu04"]),
        ("gpus[6:]", ["gpu07", "gpu08"]),
        ("gpu01,gpu01,canary", ["gpu01", "gpu05"]),
        ("canary,&gpus,!gpu05", ["gpu01"]),
    ],
)
def test_limit_patterns(inventory: Inventory, limit: str | None, expected: list[str]) -> None:
    assert names(inventory, limit) == expected


def test_limit_from_file(inventory: Inventory, tmp_path: Path) -> None:
    retry = tmp_path / "retry"
    retry.write_text("gpu04\n# a comment\ngpu06\n", encoding="utf-8")
    assert names(inventory, f"@{retry}") == ["gpu04", "gpu06"]


@pytest.mark.parametrize(
    ("limit", "detail"),
    [
        ("gpu99", "'gpu99' names no host or group"),
        ("gpus:typo", "'typo' names no host or group"),
        ("gpus:!nothing", "'nothing' names no host or group"),
        ("gpus:&edge", None),  # both exist, the intersection is empty
        ("canary:!canary", None),
        ("zz*", "names no host or group"),
        ("~^x", "names no host or group"),
        ("gpus[20]", "outside the group"),
    ],
)
def test_limit_matching_nothing_is_a_clear_error(inventory: Inventory, limit: str, detail: str | None) -> None:
    with pytest.raises(InventoryError) as caught:
        inventory.select(limit)
    message = str(caught.value)
    assert message.startswith(f"no hosts match --limit {limit!r} in {inventory.source}")
    assert "\n" not in message
    if detail:
        assert detail in message


def test_bad_regex_is_a_clear_error(inventory: Inventory) -> None:
    with pytest.raises(InventoryError, match="bad regular expression"):
        inventory.select("~gpu[")


def test_limit_missing_file_is_a_clear_error(inventory: Inventory, tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        inventory.select(f"@{tmp_path / 'missing'}")


def test_empty_inventory_selects_nothing_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "inv.ini"
    path.write_text("[gpus]\n", encoding="utf-8")
    with pytest.raises(InventoryError, match=f"no hosts in inventory {path}"):
        load_inventory(str(path)).select(None)
