"""Parsing what systemd and docker say (the text the host modules and inspect read), from samples
of systemd 252 and docker 20.10 output."""

from __future__ import annotations

import json

from gpuops.facts.server import parse_docker_inspect, parse_systemd_show
from gpuops.remote.ports import port_flag
from gpuops.remote.service_systemd import environment_entries, exec_argv, parse_show

SHOW = """Id=sglang.service
ExecStart={ path=/usr/local/bin/python-sglang ; argv[]=/usr/local/bin/python-sglang -m sglang.launch_server --tp 1 --port 44355 ; ignore_errors=no ; start_time=[Mon 2026-11-30 08:51:19 UTC] ; stop_time=[n/a] ; pid=54 ; code=(null) ; status=0/0 }
Environment="SGLANG_OPERATOR=on call" NCCL_IB_DISABLE=1 HF_TOKEN=hf_secret
EnvironmentFiles=/var/lib/gpuops/sglang.env (ignore_errors=no)
EnvironmentFiles=/etc/sglang-extra.env (ignore_errors=yes)
DropInPaths=/etc/systemd/system/sglang.service.d/a.conf /etc/systemd/system/sglang.service.d/b.conf
MainPID=54
NRestarts=2
ActiveState=active
SubState=running
FragmentPath=/etc/systemd/system/sglang.service
User=nobody
WorkingDirectory=/tmp
Restart=on-failure
"""


def test_systemctl_show_is_read_as_systemd_means_it() -> None:
    shown = parse_show(SHOW)
    assert shown["EnvironmentFiles"].splitlines() == ["/var/lib/gpuops/sglang.env (ignore_errors=no)",
                                                      "/etc/sglang-extra.env (ignore_errors=yes)"]
    assert environment_entries(shown["Environment"]) == ["SGLANG_OPERATOR=on call", "NCCL_IB_DISABLE=1", "HF_TOKEN=hf_secret"]
    assert environment_entries('"A=x \\"q\\" y" B=2') == ['A=x "q" y', "B=2"]
    argv = exec_argv(shown["ExecStart"])
    assert argv == "/usr/local/bin/python-sglang -m sglang.launch_server --tp 1 --port 44355"
    assert port_flag(argv.split()) == 44355
    unit = parse_systemd_show(SHOW.encode())
    assert unit is not None
    assert (unit.unit, unit.main_pid, unit.n_restarts, unit.user, unit.working_directory) == (
        "sglang.service", 54, 2, "nobody", "/tmp")
    assert unit.environment_files == ("/var/lib/gpuops/sglang.env", "/etc/sglang-extra.env")
    assert len(unit.drop_ins) == 2
    # A credential in the unit's Environment= never reaches the report.
    assert "hf_secret" not in " ".join(unit.environment) and unit.environment[2].startswith("HF_TOKEN=")
    assert parse_systemd_show(b"") is None and parse_systemd_show(b"Id=\n") is None


def test_port_flag_forms() -> None:
    assert port_flag(["-m", "x", "--port=31000"]) == 31000
    assert port_flag(["--port", "31001", "--port", "2"]) == 2  # SGLang's argparse: the last one wins
    assert port_flag(["--portal", "3"]) is None and port_flag(["--port"]) is None and port_flag([]) is None


def test_docker_inspect_fields_and_filtered_environment() -> None:
    raw = json.dumps({
        "id": "ab" * 32, "name": "/sglang", "image": "lmsysorg/sglang:v0.5.8", "image_id": "sha256:" + "c" * 64,
        "cmd": ["python3", "-m", "sglang.launch_server", "--api-key", "s3cret", "--port", "30000"],
        "entrypoint": None, "state": {"Status": "running", "Health": {"Status": "healthy"}},
        "restart_count": 1, "network_mode": "host", "mounts": [{"Destination": "/models"}],
    }).encode()
    box = parse_docker_inspect(raw, b"NCCL_DEBUG=WARN\nHF_TOKEN=x\n", b'["lmsysorg/sglang@sha256:dd"]\n')
    assert box is not None
    assert (box.name, box.status, box.health, box.restart_count, box.network_mode) == (
        "sglang", "running", "healthy", 1, "host")
    assert box.repo_digests == ("lmsysorg/sglang@sha256:dd",) and box.mounts == ("/models",)
    assert "s3cret" not in box.cmd and box.cmd[-2:] == ("--port", "30000")
    assert box.env == {"NCCL_DEBUG": "WARN"}  # only server-relevant names; HF_TOKEN is not one
    no_health = json.dumps({"id": "x", "state": {"Status": "exited"}}).encode()
    assert parse_docker_inspect(no_health, None, None).health is None
    assert parse_docker_inspect(b"not json", None, None) is None
