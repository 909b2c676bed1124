"""The secret never appears in anything gpuops printed or wrote at home (one policy everywhere).

A lab host whose server runs with ``--api-key`` and an ``HF_TOKEN`` in its environment; every
command an operator would run (inspect text and JSON, apply --check --diff text and JSON, a failed
apply with its log tail, history, bench, results show/list/export, report) and then a grep over every
output and every file under the operator's home and results dir. On 0.5.8 and on 0.5.23, whose
``/server_info`` carries the key in ``api_key`` and, in plain text, in ``launch_command``; the
server itself enforces the key (a 401 without it), so every answer gpuops got was asked with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

API_KEY = "sk-gpuops-leakcheck-7f3a9c"
HF_TOKEN = "hf_leakcheck_Q2w3E4r5"


@pytest.mark.parametrize("version", ["0.5.8", "0.5.23"])
def test_secret_never_appears_in_output_or_home_files(lab_factory, run_gpuops, gpuops_home: Path, tmp_path: Path,
                                                      version: str) -> None:
    from gpuops.lab.hosts import LabSpec

    lab = lab_factory(LabSpec(
        gpu="rtx-pro-6000-ws-x4", sglang=version, names=("h01",),
        server_args=("--model-path", "/models/Qwen3-32B", "--tp", "4", "--api-key", API_KEY, "--enable-metrics"),
        server_env={"SGLANG_HF_TOKEN": HF_TOKEN, "GPUOPS_STANDIN_CRASH_IF": "NCCL_ALGO=Tree"},
    ))
    inv = str(lab.inventory_path)
    results = tmp_path / "results"
    fast = ("-e", "gpuops_health_timeout=60", "-e", "gpuops_stop_grace=5")
    outputs = []

    def run(*args: str) -> str:
        proc = run_gpuops(*args, timeout=400)
        outputs.append(proc.stdout + proc.stderr)
        return proc.stdout

    import urllib.error
    import urllib.request

    port = lab.hosts[0].server_port
    with pytest.raises(urllib.error.HTTPError, match="401"):  # the server itself wants the key
        urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/server_info", headers={"Authorization": f"Bearer {API_KEY}"})
    info = json.loads(urllib.request.urlopen(request, timeout=10).read())
    assert info["api_key"] == API_KEY
    if version == "0.5.23":
        assert f"--api-key {API_KEY}" in info["launch_command"]

    run("inspect", "host", "-i", inv)
    inspected = json.loads(run("inspect", "host", "-i", inv, "--json"))
    reported = json.dumps(inspected)
    assert '"route": "/server_info"' in reported and "<masked:" in reported
    # A change to the launch that carries the key: the diff shows the file, masked.
    check = run("apply", "nccl-env", "-i", inv, "--check", "--diff", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "4"}}', *fast)
    assert "<masked:" in check or "NCCL_MIN_NCHANNELS" in check, check
    run("apply", "nccl-env", "-i", inv, "--check", "--diff", "--json", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "4"}}', *fast)
    # The stand-in crashes on NCCL_ALGO=Tree after logging its ServerArgs (api_key included), as
    # SGLang does: the failed run's log tail comes back, masked.
    failed = run("apply", "nccl-env", "-i", inv, "--json", "-e", '{"nccl_env": {"NCCL_ALGO": "Tree"}}', *fast)
    report = json.loads(failed)["hosts"]["h01"]
    assert report["status"] == "rolled_back" and report["log_tail"] and "api_key=" in report["log_tail"], report
    run("history", "-i", inv, "--json")
    bench = run("bench", "--remote", "-i", inv, "--suite", "decode", "--results-dir", str(results), "--num-requests", "2",
                "--warmup", "0", "--input-len", "16", "--output-len", "16", "--json")
    result_id = json.loads(bench)["hosts"]["h01"]["result_id"]
    run("results", "list", "--results-dir", str(results), "--json")
    shown = run("results", "show", "--results-dir", str(results), result_id, "--json")
    assert "<masked:" in shown  # the key is there, as its masked token with its short hash
    run("results", "show", "--results-dir", str(results), result_id)
    for form in ("csv", "jsonl", "prometheus"):
        run("results", "export", "--results-dir", str(results), "--format", form)
    run("report", "--results-dir", str(results), "-o", str(tmp_path / "report.html"), result_id)

    # the host's own apply journal (the failed run's reason included) is masked on the host
    host_journal = lab.hosts[0].state_dir / "journal.jsonl"
    assert host_journal.is_file() and "rolled_back" in host_journal.read_text()
    # ... and so is what the helper keeps of each call on the host (its progress, with the server's
    # log tail as the server wrote it, api_key=... included; its result; the worker's own log)
    calls = [path for path in (lab.hosts[0].state_dir / "calls").rglob("*") if path.is_file()]
    assert any(path.name == "result.json" and "log_tail" in path.read_text() for path in calls), calls
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in host_journal.read_text(), host_journal
        for path in calls:
            assert secret.encode() not in path.read_bytes(), path
        for text in outputs:
            assert secret not in text, text[:2000]
        for root in (gpuops_home, results, tmp_path / "report.html"):
            for path in ([root] if root.is_file() else root.rglob("*")):
                if path.is_file():
                    assert secret.encode() not in path.read_bytes(), path
