"""A host's connection made in a thread of its own while the caller works (transport.Opening; the
apply pipeline builds its gather's script meanwhile): the caller gets the connection, or exactly the
error connecting raised, and a connection nobody takes is closed, not left open on the host."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpuops.apply import pipeline
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.options import ApplyOptions
from gpuops.errors import TransportError
from gpuops.inventory.model import Host
from gpuops.plan.planner import Discovery
from gpuops.transport import ConnectOptions, Opening


def _host(name: str = "h1") -> Host:
    return Host(name=name, address="10.0.0.1", port=22, user="ops", key_file=None, connection="ssh", groups=(), vars={})


class Made:
    """A connection that says whether it was closed, and in which thread it was made."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.thread = threading.current_thread()
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the connection was used ({name})")


def test_the_connection_is_made_beside_the_caller_and_handed_over() -> None:
    made: list[Made] = []
    opening = Opening(_host(), ConnectOptions(connector=lambda host: made.append(Made(host)) or made[-1]))
    conn = opening.connection()
    assert conn is made[0] and conn.host.name == "h1"
    assert made[0].thread is not threading.current_thread()


def test_what_connecting_raised_is_raised_to_the_caller() -> None:
    def refuse(host: Host) -> Any:
        raise TransportError(host.name, "connection refused by 127.0.0.1:9")

    opening = Opening(_host(), ConnectOptions(connector=refuse))
    with pytest.raises(TransportError, match="h1: connection refused by 127.0.0.1:9"):
        opening.connection()


def test_an_apply_whose_script_cannot_be_built_closes_the_connection_made_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Made] = []

    def cannot_build(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the probes could not be built")

    monkeypatch.setattr(pipeline, "gather_probes", cannot_build)
    options = ApplyOptions(connect=ConnectOptions(connector=lambda host: made.append(Made(host)) or made[-1]))
    discovery = Discovery(paths=(), needs_gate_scan=False, state_dir="/var/lib/gpuops", python="python3", warnings=())
    with pytest.raises(RuntimeError, match="could not be built"):
        pipeline.run_host(_host(), "nccl-env", ExtraVars({}), discovery, options, "run-1")
    assert made and made[0].closed.is_set()
