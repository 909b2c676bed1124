"""docs/inspect-json.md documents every key `inspect host --json` writes for a host's facts (the
schema is a contract: a key added in code without its line in the document fails here)."""

from __future__ import annotations

import dataclasses

import pytest
from labtools import REPO_ROOT

from gpuops.facts.gpu import Gpu
from gpuops.facts.host import host_facts
from gpuops.facts.served_model import ModelFacts
from gpuops.facts.to_json import facts_json

DOC = (REPO_ROOT / "docs" / "inspect-json.md").read_text()


def _document() -> dict:
    return facts_json(host_facts({}))  # every probe missing: every key is still there, unknown


def _keys() -> list[tuple[str, str]]:
    doc = _document()
    keys = [("facts", k) for k in doc]
    keys += [("gpus[]", f.name) for f in dataclasses.fields(Gpu)]
    keys += [("model", f.name) for f in dataclasses.fields(ModelFacts)]
    for part in ("interconnect", "software", "server"):
        keys += [(part, k) for k in doc[part]]
    return keys


@pytest.mark.parametrize("where, key", _keys(), ids=lambda v: str(v))
def test_every_key_is_documented(where: str, key: str) -> None:
    assert f"`{key}`" in DOC, f"docs/inspect-json.md does not document {where}.{key}"


def test_the_unknown_host_document_has_every_part() -> None:
    doc = _document()
    assert doc["gpu_status"]["known"] is False and doc["gpu_status"]["reason"] == "probe gpu.query did not run"
    assert doc["interconnect"]["known"] is False and doc["interconnect"]["reason"] == "probe gpu.topo did not run"
