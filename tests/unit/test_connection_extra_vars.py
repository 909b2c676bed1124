"""`-e ansible_become=true` (or any connection variable) must not be silently ignored: the connection
is made from the inventory and the command's flags, so such a variable is refused in one line, exit 2,
before any host is contacted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.errors import GpuopsError
from gpuops.transport.connvars import refuse_connection_vars


@pytest.mark.parametrize("name, says", [
    ("ansible_become", "use -b/--become"),
    ("ansible_user", "use -u USER"),
    ("ansible_port", "set it in the inventory"),
    ("ansible_ssh_common_args", "set it in the inventory"),
])
def test_a_connection_variable_is_refused_naming_what_works(name: str, says: str) -> None:
    with pytest.raises(GpuopsError) as refused:
        refuse_connection_vars({name: "x"})
    text = str(refused.value)
    assert text.startswith(f"-e {name}: ") and says in text and "\n" not in text, text


@pytest.mark.parametrize("extra", [{"ansible_python_interpreter": "/usr/bin/python3"}, {"nccl_env": {"NCCL_ALGO": "Tree"}},
                                   {"gpuops_lease": 30}, {}])
def test_variables_the_run_reads_pass(extra: dict) -> None:
    refuse_connection_vars(extra)


def test_the_cli_refuses_before_any_connection(tmp_path: Path) -> None:
    # Port 9 on loopback: nothing listens there; the refusal must come before a connection is tried.
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01: {ansible_host: 127.0.0.1, ansible_port: 9}\n")
    done = subprocess.run([sys.executable, "-m", "gpuops.cli", "apply", "nccl-env", "-i", "hosts.yml", "--check",
                           "-e", "ansible_become=true"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "-e ansible_become" in lines[0] and "-b/--become" in lines[0], done.stderr
    assert "Connection refused" not in done.stderr and "gpu01" not in done.stdout
