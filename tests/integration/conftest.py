"""Fixtures shared by several integration modules (the rest live in tests/conftest.py)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from deployment_nodes import start_nodes

from gpuops.lab.hosts import Lab, stop_lab


@pytest.fixture(scope="module")
def nodes(lab_factory: Any) -> Iterator[tuple[Lab, int]]:
    """A module's two deployment nodes (tests/integration/deployment_nodes.py), each test leaving
    them healthy on a setting of its own; stopped with the module (the factory's labs live to the
    session's end). test_deployment_roll, _rollback and _split use it; a module may define its own."""
    lab, port = start_nodes(lab_factory)
    yield lab, port
    stop_lab(lab.root)
