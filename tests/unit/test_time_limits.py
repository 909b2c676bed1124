"""Every command that works on hosts has a time limit per host when --timeout is not given
(issue 42: apply, rollback, history, bench and tune had none, and a host that never answered held
gpuops for good), and --timeout overrides it. The command line is run (click's runner) up to the
point where the limit is handed on, with that call replaced by one that records it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuops import time_limits
from gpuops.cli import cli

INVENTORY = "all:\n  hosts:\n    h1:\n      ansible_host: 127.0.0.1\n"


class Handed(Exception):
    """Raised by the stand-in for the call that takes the limit: nothing reaches a host."""


def _seen(monkeypatch, module: str, name: str, key: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def record(*args: Any, **kwargs: Any) -> Any:
        for value in (*args, *kwargs.values()):
            if key == "timeout" and "timeout" in kwargs:
                seen["timeout"] = kwargs["timeout"]
            elif hasattr(value, key):
                seen["timeout"] = getattr(value, key)
        raise Handed

    monkeypatch.setattr(f"{module}.{name}", record)
    return seen


CASES = {
    "apply": (["apply", "nccl-env"], "gpuops.commands.apply", "apply_role", "timeout"),
    "rollback": (["rollback"], "gpuops.commands.apply", "rollback_hosts", "timeout"),
    "history": (["history"], "gpuops.commands.apply", "history_hosts", "timeout"),
    "bench": (["bench", "decode", "--remote"], "gpuops.commands.bench", "run_bench", "timeout"),
    "tune": (["tune", "--sweep", "NCCL_ALGO=Ring,Tree"], "gpuops.commands.tune", "run_sweep", "timeout"),
    "profile": (["profile", "--remote"], "gpuops.bench.runner", "run_bench", "timeout"),  # imported when run
}


@pytest.mark.parametrize("command", list(CASES))
@pytest.mark.parametrize("given", [None, 42.0], ids=["default", "given"])
def test_the_limit_handed_on_is_the_default_or_the_one_given(tmp_path: Path, monkeypatch, command: str,
                                                             given: float | None) -> None:
    args, module, name, key = CASES[command]
    if command == "rollback":  # the split-deployment check asks no host for a lab-less inventory
        monkeypatch.setattr("gpuops.commands.apply.deployment_repair.before_command", lambda *a, **k: ({}, None))
    seen = _seen(monkeypatch, module, name, key)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(INVENTORY)
    extra = [] if given is None else ["--timeout", str(given)]
    stored = ["--results-dir", str(tmp_path / "r")] if command in ("bench", "profile") else ["--json"]
    done = CliRunner().invoke(cli, [*args, "-i", str(inventory), *extra, *stored])
    assert isinstance(done.exception, Handed), (done.output, done.exception)
    assert seen["timeout"] == (time_limits.DEFAULTS[command] if given is None else given)


def test_every_command_that_reaches_hosts_has_a_finite_default() -> None:
    for command in ("inspect", "advise", "apply", "rollback", "history", "bench", "tune", "profile"):
        assert 0 < time_limits.per_host(command, None) < 86400
    assert time_limits.per_host("apply", 5.0) == 5.0
