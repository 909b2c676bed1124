"""HostFacts -> the stable JSON shape documented in docs/inspect-json.md (pure).

The shape is a contract with scripts and with other parts of gpuops (gates, bench): keys are only
ever added, never renamed or removed (tests/unit/test_inspect_json_doc.py checks the document
names every key). Each fact module writes its own part (``gpu_json``, ``interconnect_json``,
``software_json``, ``server_json``, ``model_json``); this file puts them together.
"""

from __future__ import annotations

from gpuops.facts.gpu import GpuPartJSON, gpu_json
from gpuops.facts.host import HostFacts
from gpuops.facts.served_model import ModelJSON, model_json
from gpuops.facts.server_json import ServerJSON, server_json
from gpuops.facts.software import SoftwareJSON, software_json
from gpuops.facts.topology import InterconnectJSON, interconnect_json

SCHEMA_VERSION = 1


class ServerPartJSON(ServerJSON):
    """The ``server`` key: ``server_json`` and the server's python version."""

    python_version: str | None


class FactsJSON(GpuPartJSON):
    """One host's ``facts`` of the inspect document: the GPU keys at the top, then one key a fact."""

    schema: int
    interconnect: InterconnectJSON
    software: SoftwareJSON
    server: ServerPartJSON
    model: ModelJSON | None
    warnings: list[str]


def _server_python_version(facts: HostFacts) -> str | None:
    """The server's python version, known when the probes ran with the server's own interpreter."""
    reason = facts.system.chosen_python_reason or ""
    if facts.server.running and reason.startswith("the running SGLang server's interpreter"):
        return facts.packages.python_version
    return None


def facts_json(facts: HostFacts) -> FactsJSON:
    return {
        "schema": SCHEMA_VERSION,
        **gpu_json(facts.gpu, facts.banner),
        "interconnect": interconnect_json(facts.interconnect),
        "software": software_json(facts.system, facts.packages),
        "server": {**server_json(facts.server), "python_version": _server_python_version(facts)},
        "model": model_json(facts.server.model),
        "warnings": list(facts.warnings),
    }
