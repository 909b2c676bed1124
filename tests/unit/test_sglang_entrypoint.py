"""Which entrypoint each real SGLang release recommends, read from its own source (the cached releases,
gpuops.lab.sglang_cache), and how the launch files use it."""

from __future__ import annotations

import ast
import dataclasses
import json
import shlex
import sys
from pathlib import Path

import pytest

from gpuops.apply.probes import parse_entrypoints
from gpuops.gather import ProbeOutput
from gpuops.lab.sglang_cache import sglang_site
from gpuops.plan.entrypoint import LaunchEntry, parse_entry
from gpuops.plan.planner import discover, plan_role
from gpuops.remote import sglang_entrypoint
from test_plan import BASE_VARS, STATE, empty_facts

# 0.5.8 has `sglang serve` but launch_server does not point at it; from 0.5.16 on it warns that
# `sglang serve` is the recommended entrypoint. 0.4.10 has no CLI at all.
RECOMMENDS = {"0.4.10": False, "0.5.8": False, "0.5.16": True, "0.5.20": True, "0.5.21": True, "0.5.22": True,
              "0.5.23": True}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@pytest.mark.parametrize("version", sorted(RECOMMENDS))
def test_each_release_says_itself_whether_sglang_serve_is_recommended(version: str) -> None:
    package = sglang_site(version) / "sglang"
    assert sglang_entrypoint.recommends_serve(_tree(package / "launch_server.py")) is RECOMMENDS[version]
    cli = package / "cli" / "main.py"
    assert cli.exists() is (version != "0.4.10")
    if cli.exists():
        assert sglang_entrypoint.has_serve_command(_tree(cli))
        (info,) = sglang_site(version).glob("sglang-*.dist-info")
        assert sglang_entrypoint._declares_script((info / "entry_points.txt").read_text())


def test_a_script_of_another_name_or_section_is_not_the_console_script() -> None:
    assert not sglang_entrypoint._declares_script("[console_scripts]\nkillall_sglang = sglang.cli.killall:main\n")
    assert not sglang_entrypoint._declares_script("[gui_scripts]\nsglang = sglang.cli.main:main\n")
    assert sglang_entrypoint._declares_script("[console_scripts]\nkillall_sglang = x:y\nsglang = sglang.cli.main:main\n")


def test_a_warning_outside_the_main_block_or_about_something_else_does_not_count() -> None:
    assert not sglang_entrypoint.recommends_serve(ast.parse(
        "import warnings\nwarnings.warn(\"'sglang serve' is the recommended entrypoint\")\n"))
    assert not sglang_entrypoint.recommends_serve(ast.parse(
        "import warnings\nif __name__ == '__main__':\n    warnings.warn('deprecated flag --foo')\n"))
    assert sglang_entrypoint.recommends_serve(ast.parse(
        "import warnings\nif __name__ == '__main__':\n    warnings.warn(\"'sglang serve' is the recommended "
        "entrypoint.\")\n"))
    assert not sglang_entrypoint.has_serve_command(ast.parse("p.add_parser('generate')\n"))


def test_pythons_of_desired_reads_every_run_s_python_and_its_pythonpath(tmp_path: Path) -> None:
    desired = tmp_path / "desired.json"
    desired.write_text(json.dumps({"schema": 1, "contributions": {
        "nccl-env": {"env": {"NCCL_MIN_NCHANNELS": "4"}},
        "sglang-release": {"python": "/opt/envs/sglang-0.5.23-ab/bin/python", "renames": {},
                           "env": {"PYTHONPATH": ""}},
        "other": {"python": "relative/python"}}}))
    assert sglang_entrypoint.pythons_of(str(desired)) == [("/opt/envs/sglang-0.5.23-ab/bin/python", "")]
    assert sglang_entrypoint.pythons_of(str(tmp_path / "absent.json")) == []
    desired.write_text("{not json")
    assert sglang_entrypoint.pythons_of(str(desired)) == []


@pytest.mark.parametrize("answer", [
    {"python": "/v/bin/python", "entrypoint": "serve", "script": None, "why": "x"},          # serve needs a script
    {"python": "/v/bin/python", "entrypoint": "serve", "script": "bin/sglang", "why": "x"},  # ... an absolute one
    {"python": "/v/bin/python", "entrypoint": "run", "script": None, "why": "x"},
    {"python": "/v/bin/py\nthon", "entrypoint": "launch_server", "script": None, "why": "x"},
    ["not", "a", "dict"],
])
def test_a_hosts_answer_that_is_not_one_is_dropped(answer: object) -> None:
    assert parse_entry(answer) is None


def test_the_probes_lines_become_typed_entries() -> None:
    lines = "\n".join([
        "some wrapper's banner",
        json.dumps({"python": "/v/bin/python", "entrypoint": "serve", "script": "/v/bin/sglang", "why": "w"}),
        json.dumps({"python": "python3", "entrypoint": "launch_server", "script": None, "why": "old"}),
    ])
    found = parse_entrypoints(ProbeOutput(stdout=lines, stderr="", exit_status=0))
    assert found["/v/bin/python"].words == ("/v/bin/sglang", "serve")
    assert found["python3"].words == ("-m", "sglang.launch_server")


SERVE = LaunchEntry(python="/opt/venv/bin/python", entrypoint="serve", script="/opt/venv/bin/sglang", why="w")


def _exec_words(plan: object, path: str) -> list[str]:
    text = next(c.after for c in plan.changes if c.path == path)  # type: ignore[attr-defined]
    line = next(ln for ln in text.splitlines() if ln.startswith(("exec ", "ExecStart=")))
    return shlex.split(line.removeprefix("ExecStart="))


def test_the_launch_uses_sglang_serve_where_the_release_recommends_it() -> None:
    assert discover("sglang-service", "h01", BASE_VARS, {}).entrypoint_pythons == ("/opt/venv/bin/python",)
    facts = dataclasses.replace(empty_facts("sglang-service", BASE_VARS), entrypoints={SERVE.python: SERVE})
    plan = plan_role("sglang-service", facts, BASE_VARS, {})
    assert _exec_words(plan, f"{STATE}/sglang-launch.sh")[:4] == ["exec", "/opt/venv/bin/python",
                                                                 "/opt/venv/bin/sglang", "serve"]
    systemd = dict(BASE_VARS, sglang_manager="systemd")
    facts = dataclasses.replace(empty_facts("sglang-service", systemd), entrypoints={SERVE.python: SERVE})
    plan = plan_role("sglang-service", facts, systemd, {})
    assert _exec_words(plan, "/etc/systemd/system/sglang.service")[:3] == ["/opt/venv/bin/python",
                                                                           "/opt/venv/bin/sglang", "serve"]


@pytest.mark.parametrize("entrypoints", [
    {},                                                                                  # not read
    {SERVE.python: dataclasses.replace(SERVE, entrypoint="launch_server", script=None)},  # an older release
], ids=["unread", "launch_server"])
def test_otherwise_the_launch_is_byte_for_byte_what_it_was(entrypoints: dict) -> None:
    facts = dataclasses.replace(empty_facts("sglang-service", BASE_VARS), entrypoints=entrypoints)
    plan = plan_role("sglang-service", facts, BASE_VARS, {})
    launch = next(c.after for c in plan.changes if c.path == f"{STATE}/sglang-launch.sh")
    assert "exec /opt/venv/bin/python -m sglang.launch_server --model-path" in launch
    assert plan.entrypoints_unread == (() if entrypoints else ("/opt/venv/bin/python",))


def test_the_drivers_own_python_answers_without_a_second_start(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Promise: the gather's python, asked about itself under the same PYTHONPATH, answers in its own
    process (one interpreter start less per apply's gather); under another PYTHONPATH (``--isolated``)
    it is still started anew. A python that is not there can only answer from this process."""
    here = "/nonexistent/bin/python"
    monkeypatch.setattr(sys, "executable", here)
    sglang_entrypoint.drive([here], "")
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [a["python"] for a in answers] == [here] and answers[0]["entrypoint"] in ("serve", "launch_server")
    sglang_entrypoint.drive(["--isolated", here], "")
    assert capsys.readouterr().out == ""  # asked under an empty PYTHONPATH: started, and not there
