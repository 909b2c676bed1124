"""HostFacts -> the stable JSON shape documented in docs/inspect-json.md (pure).

The shape is a contract with scripts and with other parts of gpuops (gates, bench): keys are only
ever added, never renamed or removed (tests/unit/test_inspect_json_doc.py checks the document
names every key). Each fact module writes its own part (``gpu_json``, ``interconnect_json``,
``software_json``, ``server_json``, ``model_json``); this file puts them together.
"""

from __future__ import annotations

from typing import Any

from gpuops.facts.gpu import gpu_json
from gpuops.facts.host import HostFacts
from gpuops.facts.served_model import model_json
from gpuops.facts.server import server_json
from gpuops.facts.software import software_json
from gpuops.facts.topology import interconnect_json

SCHEMA_VERSION = 1


def _server_python_version(facts: HostFacts) -> str | None:
    """The server's python version, known when the probes ran with the server's own interpreter."""
    reason = facts.system.chosen_python_reason or ""
    if facts.server.running and reason.startswith("the running SGLang server's interpreter"):
        return facts.packages.python_version
    return None


def facts_json(facts: HostFacts) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        **gpu_json(facts.gpu, facts.banner),
        "interconnect": interconnect_json(facts.interconnect),
        "software": software_json(facts.system, facts.packages),
        "server": {**server_json(facts.server), "python_version": _server_python_version(facts)},
        "model": model_json(facts.server.model),
        "warnings": list(facts.warnings),
    }
