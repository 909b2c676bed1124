"""Helpers shipped on stdin: payloads arrive as data, never as shell text."""

from __future__ import annotations

import json
from pathlib import Path

from gpuops import shipping
from gpuops.inventory import Host
from gpuops.transport.local import LocalConnection

ECHO_HELPER = "import json, sys\nprint(json.dumps(json.loads(GPUOPS_PAYLOAD)))\n"


def _local() -> LocalConnection:
    return LocalConnection(Host(name="localhost", address=None, port=None, user=None, key_file=None,
                                connection="local", groups=(), vars={}))


def test_hostile_payload_is_inert(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    payload = {"a": f"$(touch {target})", "b": f"`touch {target}`", "c": "'; touch " + str(target) + "; '"}
    result = _local().run(shipping.python_command(), shipping.python_stdin(ECHO_HELPER, payload, is_source=True))
    assert result.exit_status == 0, result.stderr
    assert json.loads(result.stdout) == payload
    assert not target.exists()


def test_named_python_is_quoted(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    result = _local().run(shipping.python_command(f"python3; touch {marker}"), b"")
    assert result.exit_status == 127  # "python3; touch ..." is looked up as one (missing) program name
    assert not marker.exists()        # and nothing after ';' ran as a command


def test_payload_separator_inside_payload_is_harmless() -> None:
    payload = {"text": shipping.PAYLOAD_SEPARATOR.decode()}
    result = _local().run(shipping.python_command(), shipping.python_stdin(ECHO_HELPER, payload, is_source=True))
    assert json.loads(result.stdout) == payload

