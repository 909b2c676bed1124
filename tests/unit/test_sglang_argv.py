"""The one SGLang argv parser (``gpuops.remote.sglang_argv``) on its edge cases, and every reader
of SGLang argv held to it: the facts, the lab's host description, the stand-in server (run as a
file, importing its copied sibling), the host's port check and the gather's ``gpuops_flag`` sh
function (which cannot import it: it runs before any python is chosen)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.facts.python_select import _FUNCTIONS
from gpuops.facts.server_args import settings_from_argv
from gpuops.lab.gpu_description import with_port
from gpuops.remote.ports import port_flag
from gpuops.remote.sglang_argv import first_of, flag_value, launch_args, parse_flags, with_flag

LAUNCH = ["/venv/bin/python3", "-m", "sglang.launch_server"]


@pytest.mark.parametrize("words, flags, positional", [
    (["--port=31000"], {"port": "31000"}, []),                                 # --flag=value
    (["--port", "31000"], {"port": "31000"}, []),                              # --flag value
    (["--trust-remote-code", "--tp", "8"], {"trust_remote_code": True, "tp": "8"}, []),  # a switch
    (["--tp", "2", "--tp", "8"], {"tp": "8"}, []),                             # repeated: the last wins
    (["--tp=2", "--tp"], {"tp": True}, []),                                    # ... even a bare switch
    (["--cuda-graph-bs", "1", "2", "4"], {"cuda_graph_bs": ["1", "2", "4"]}, []),  # several values
    (["--random-seed", "-1"], {"random_seed": "-1"}, []),                      # a negative number is a value
    (["--chat-template", "{% if x %} a b {% endif %}"], {"chat_template": "{% if x %} a b {% endif %}"}, []),
    (["--api-key="], {"api_key": ""}, []),                                     # an empty inline value
    (["--json-model-override-args=--x=1"], {"json_model_override_args": "--x=1"}, []),  # inline: taken whole
    (["--model-path", "--tp", "8"], {"model_path": True, "tp": "8"}, []),      # no value before the next flag
    (["/models/m", "--tp", "8"], {"tp": "8"}, ["/models/m"]),                  # sglang serve MODEL
    (["--", "x"], {}, ["--", "x"]),                                            # "--" alone is not a flag
])
def test_parse_flags_edge_cases(words: list[str], flags: dict, positional: list[str]) -> None:
    assert parse_flags(words) == (flags, positional)


def test_quoted_values_from_a_command_line_stay_one_word() -> None:
    line = """python3 -m sglang.launch_server --model-path '/models/My Model' --served-model-name="kimi k2" --tp 8"""
    flags, _ = parse_flags(launch_args(shlex.split(line)) or [])
    assert flags == {"model_path": "/models/My Model", "served_model_name": "kimi k2", "tp": "8"}


def test_launch_args_forms() -> None:
    assert launch_args([*LAUNCH, "--tp", "2"]) == ["--tp", "2"]
    assert launch_args(["/venv/bin/sglang", "serve", "m"]) == ["m"]
    assert launch_args(["python3", "-m", "sglang.cli.main", "serve", "--port", "1"]) == ["--port", "1"]
    assert launch_args(["python3", "/src/sglang/launch_server.py", "--tp", "2"]) == ["--tp", "2"]
    assert launch_args(["python3", "-m", "vllm.entrypoints.api_server", "serve"]) is None
    assert launch_args(["python3", "serve"]) is None


def test_flag_value_first_of_and_with_flag() -> None:
    assert flag_value(["--port", "1", "--port=2"], "--port") == "2"
    assert flag_value(["--port"], "--port") is None and flag_value([], "--port") is None
    assert flag_value(["--cuda-graph-bs", "1", "2"], "--cuda-graph-bs") == "1"
    assert first_of(parse_flags(["--tensor-parallel-size", "4"])[0], "tp_size") == "4"
    assert first_of(parse_flags(["--model", "m"])[0], "model_path") == "m"
    assert with_flag(["--port", "1", "--tp", "2"], "--port", 9) == ["--port", "9", "--tp", "2"]
    assert with_flag(["--port=1"], "--port", 9) == ["--port=9"]
    assert with_flag(["--tp", "2"], "--port", 9) == ["--tp", "2", "--port", "9"]
    assert parse_flags(with_flag(["--port", "--tp", "2"], "--port", 9))[0]["port"] == "9"


def test_every_reader_agrees() -> None:
    argv = [*LAUNCH, "--model", "/m", "--port", "1", "--tensor-parallel-size", "4", "--port=31000"]
    settings = settings_from_argv(argv)
    assert (settings.port, settings.tp_size, settings.model_path) == (31000, 4, "/m")
    assert port_flag(argv) == 31000
    assert flag_value(with_port(argv[3:], 32000), "--port") == "32000"


CASES = [
    (["--port", "31000"], "31000"),
    (["--port=31000"], "31000"),
    (["--port", "1", "--port=2"], "2"),
    (["--port=1", "--port", "3"], "3"),
    (["--port"], ""),
    (["--port", "--tp", "8"], ""),
    (["--port="], ""),
    (["--port", "-1"], "-1"),
    (["--portal", "5", "--tp", "8"], ""),
    (["--port", "7", "8"], "7"),
    (["--tp", "8"], ""),
]


@pytest.mark.parametrize("words, expected", CASES)
def test_the_gather_sh_function_follows_the_same_rules(words: list[str], expected: str) -> None:
    script = _FUNCTIONS + '\nprintf "%s\\n" "$@" | gpuops_flag_in --port\n'
    done = subprocess.run(["sh", "-c", script, "sh", *LAUNCH, *words], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == expected
    assert (flag_value(launch_args([*LAUNCH, *words]) or [], "--port") or "") == expected


def test_the_standin_reads_flags_with_its_copied_sibling(tmp_path: Path) -> None:
    """As the lab runs it: a file in a dir with its siblings, no gpuops importable."""
    from gpuops.lab.hosts import STANDIN, STANDIN_SIBLINGS

    for path in (STANDIN, *STANDIN_SIBLINGS):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; import standin_server, standin_sim as s, sglang_argv; "
            "assert 'gpuops' not in sys.modules; "
            "print(sorted(s.parse_flags(['-m', 'sglang.launch_server', '--tp', '8', '--port=1', '--port', '2', "
            "'--cuda-graph-bs', '1', '2', '--trust-remote-code', '--random-seed', '-1']).items()))")
    done = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("[('cuda_graph_bs', [1, 2]), ('port', 2), ('random_seed', -1), "
                                   "('tp_size', 8), ('trust_remote_code', True)]")
