"""apply on a docker-managed host: the gather reads SGLang in the container, the re-audit reads it
in the derived image (see plan/image_patch.py and remote/container_image.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping
from gpuops.facts.container_python import (CONTAINER_PROBE, ContainerFacts, container_probe, in_container, in_image,
                                           is_container_facts)

if TYPE_CHECKING:
    from gpuops.plan.model import Plan
    from gpuops.plan.planner import Discovery


def gather_probes(discovery: "Discovery", probes: list[Any]) -> list[Any]:
    """The gate scan with the container's python, and what the container runs (``docker inspect``),
    on a docker host whose role scans gates; ``probes`` as they are otherwise."""

    target = discovery.container
    if target is None or not discovery.needs_gate_scan:
        return probes
    return [in_container(p, target) if p.name == "gates.scan" else p for p in probes] + [container_probe(target)]


def container_facts(values: Mapping[str, object]) -> ContainerFacts | None:
    value = values.get(CONTAINER_PROBE)
    return value if is_container_facts(value) else None


def audit_script(plan: "Plan", script: str) -> str:
    """The re-audit's sh: in the derived image when the plan builds one (no container runs it yet)."""
    if plan.image is None:
        return script

    return in_image(script, plan.image.tag, plan.image.python)
