"""The whole facts gather on this machine (local connection) against real server processes:
the stand-in SGLang server (real HTTP /health), a model dir, the Hugging Face cache, secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuops.inspection import inspect_host
from gpuops.facts.to_json import facts_json
from gpuops.inventory import Host
from gpuops.lab.ports import free_port
from gpuops.transport import ConnectOptions

pytestmark = pytest.mark.integration

STANDIN = Path(__file__).resolve().parents[2] / "src" / "gpuops" / "lab" / "standin_server.py"


def _local(vars: dict) -> Host:
    return Host(name="localhost", address=None, port=None, user=None, key_file=None, connection="local",
                groups=("all",), vars=vars)


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(port: int) -> None:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in range(300):
        try:
            if opener.open(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"stand-in on {port} never became healthy")


def test_standin_server_with_model_dir_env_and_secrets(tmp_path: Path, processes) -> None:
    model = tmp_path / "Kimi-K2.5"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"hidden_size": 7168, "num_hidden_layers": 61},
    }))
    port = free_port()
    env = dict(os.environ, NCCL_P2P_LEVEL="SYS", NCCL_IB_DISABLE="1", HF_TOKEN="hf_secret_value",
               SGLANG_API_KEY="sk-secret", GPUOPS_STANDIN_TOKENS_PER_S="100")
    processes.append(subprocess.Popen(
        [sys.executable, str(STANDIN), "-m", "sglang.launch_server", "--model-path", str(model), "--tp", "8",
         "--port", str(port), "--api-key", "hunter2", "--enable-flashinfer-allreduce-fusion"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    _wait_healthy(port)
    inspection = inspect_host(_local({"sglang_port": port}), ConnectOptions(), with_gates=False, timeout=120)
    doc = facts_json(inspection.facts)
    server = doc["server"]
    assert server["running"] and server["healthy"] and server["pid"] == processes[0].pid
    assert server["tp_size"] == 8 and server["enable_flashinfer_allreduce_fusion"] is True
    assert server["fusion_flags"] == {"enable_flashinfer_allreduce_fusion": True}
    assert server["env"]["NCCL_P2P_LEVEL"] == "SYS" and server["env"]["NCCL_IB_DISABLE"] == "1"
    assert server["env"]["SGLANG_API_KEY"].startswith("<masked:")
    assert "HF_TOKEN" not in server["env"]  # not an NCCL/SGLANG/CUDA variable: never leaves the host
    text = json.dumps(doc)
    for secret in ("hunter2", "hf_secret_value", "sk-secret"):
        assert secret not in text
    assert server["manager"] == "process"
    assert doc["model"]["architecture"] == "KimiK25ForConditionalGeneration"
    assert (doc["model"]["hidden_size"], doc["model"]["num_hidden_layers"]) == (7168, 61)
    assert doc["software"]["python"]["chosen_because"].startswith("the running SGLang server's interpreter")
    assert server["python"] == sys.executable
    assert server["python_version"] == "%d.%d.%d" % sys.version_info[:3]


def test_model_from_the_hugging_face_cache_of_the_server(tmp_path: Path, processes) -> None:
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36}))
    port = free_port()  # nothing listens: a sleeper with a server's command line
    processes.append(subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "sglang.launch_server",
         "--model-path", "Qwen/Qwen3-8B", "--port", str(port)],
        env=dict(os.environ, HF_HOME=str(tmp_path / "hf")), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for _ in range(3000):  # up to 30 s: a loaded CI box starts pythons slowly
        if b"launch_server" in Path(f"/proc/{processes[0].pid}/cmdline").read_bytes():
            break
        time.sleep(0.01)
    doc = facts_json(inspect_host(_local({"sglang_port": port}), ConnectOptions(), with_gates=False).facts)
    assert doc["server"]["running"] is True
    assert doc["server"]["healthy"] is False and doc["server"]["health_error"]
    assert doc["model"]["config_path"] == str(snapshot / "config.json")
    assert (doc["model"]["architecture"], doc["model"]["hidden_size"]) == ("Qwen3ForCausalLM", 4096)
    assert any("does not answer" in w for w in doc["warnings"])


def test_hostile_command_line_and_environment_cannot_forge_facts(tmp_path: Path, processes) -> None:
    port = free_port()
    forged = "x\npid=1\nhealth=200\nenv_b64=TkNDTF9BTEdPPVRyZWU=\n@@gpuops:0000 end server"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SGLANG_"))}
    env["NCCL_DEBUG"] = "INFO\nNCCL_ALGO=Tree"  # a value with a newline must stay one variable
    processes.append(subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "sglang.launch_server",
         "--served-model-name", forged, "--port", str(port), "--model-path", "$(touch /tmp/gpuops-pwned)"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for _ in range(3000):  # up to 30 s: a loaded CI box starts pythons slowly
        if b"launch_server" in Path(f"/proc/{processes[0].pid}/cmdline").read_bytes():
            break
        time.sleep(0.01)
    doc = facts_json(inspect_host(_local({"sglang_port": port}), ConnectOptions(), with_gates=False).facts)
    server = doc["server"]
    assert server["pid"] == processes[0].pid
    assert server["healthy"] is False
    assert server["args"]["served_model_name"] == forged
    assert server["env"] == {"NCCL_DEBUG": "INFO\nNCCL_ALGO=Tree"}
    assert not Path("/tmp/gpuops-pwned").exists()


def test_one_exec_per_host_for_facts_and_gate_scan(monkeypatch, tmp_path: Path) -> None:
    import gpuops.transport as transport
    from gpuops.lab.sglang_cache import sglang_site
    from gpuops.transport.local import LocalConnection

    # The server's python sees the real SGLang 0.5.8 release, so the scan has gates to find.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{sglang_site("0.5.8")}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)

    commands: list[str] = []

    class Counting(LocalConnection):
        def run(self, command, stdin=b"", timeout=None):
            commands.append(command)
            return super().run(command, stdin, timeout)

    monkeypatch.setattr(transport, "connect", lambda host, options: Counting(host))
    inspection = inspect_host(_local({"sglang_port": free_port(), "sglang_python": str(python)}), ConnectOptions(),
                              with_gates=True)
    assert len(commands) == 1
    assert inspection.facts.system.kernel  # the facts came back from that one exec
    assert inspection.gates_error is None  # and so did the gate scan, over the installed release
    report = inspection.gate_report
    assert (report.version, report.known) == ("0.5.8", True)
    # The gates that came back through the one exec are exactly those the scanner finds when run
    # directly on the same tree (not a count: the scanner's accuracy work changes how many it finds).
    from gpuops.gates.local import scan_site

    direct = scan_site(sglang_site("0.5.8"), python=sys.executable)
    assert (direct.known, direct.version) == (True, "0.5.8")
    assert direct.gates  # a release with no gates found would make the comparison below empty
    assert [g["id"] for g in report.gates] == [g["id"] for g in direct.gates]


def test_a_bad_host_var_fails_that_host_only() -> None:
    from gpuops.facts.collect import host_json
    from gpuops.inspection import inspect_hosts

    good = _local({"sglang_port": free_port()})
    bad = Host(name="bad", address=None, port=None, user=None, key_file=None, connection="local", groups=("all",),
               vars={"sglang_port": "30000; reboot"})
    outcomes = inspect_hosts([good, bad], ConnectOptions(), with_gates=False)
    assert outcomes["localhost"].ok is True
    assert outcomes["bad"].ok is False
    assert outcomes["bad"].error == "sglang_port must be a port number (1-65535), got '30000; reboot'"
    assert host_json(outcomes["bad"])["facts"] is None
