"""Secrets inside values a server reports (``secret_policy.mask_reported``) and the frames a bench
host sends home (``bench/frames.parse_frames``): masked wherever they appear, with the short hash
that lets two configurations be told apart."""

from __future__ import annotations

import json

from gpuops.bench.frames import parse_frames
from gpuops.remote.sglang_server import hide, masked
from gpuops.secret_policy import command_line_secrets, mask, mask_reported

KEY = "sk-reported-5e6f7a"
ADMIN = "adm-reported-0b1c2d"
TOKEN = "hf_reportedQ1w2E3"


def test_a_server_info_of_0_5_23_is_masked_in_fields_command_lines_and_free_text() -> None:
    info = {
        "api_key": KEY, "admin_api_key": ADMIN, "tp_size": 8, "max_total_tokens": 123456,
        "launch_command": f"--model-path /m --api-key {KEY} --admin-api-key={ADMIN} --tp 8 --enable-metrics",
        "internal_states": [{"note": f"rejected Bearer {KEY}"}],
        "docker": {"cmd": ["python3", "-m", "sglang.launch_server", "--api-key", KEY]},
        "unit": {"exec_start": f"{{ argv[]=/usr/bin/env HF_TOKEN={TOKEN} python3 -m sglang.launch_server }}"},
        "log": f"ServerArgs(api_key='{KEY}', tokenizer_path=None)",
        "url": "http://user:pw-9z8y@127.0.0.1:30000",
    }
    out = mask_reported(info)
    text = json.dumps(out)
    for secret in (KEY, ADMIN, TOKEN, "pw-9z8y"):
        assert secret not in text, secret
    assert out["api_key"] == mask(KEY) and out["tp_size"] == 8 and out["max_total_tokens"] == 123456
    assert out["launch_command"] == f"--model-path /m --api-key {mask(KEY)} --admin-api-key={mask(ADMIN)} --tp 8 --enable-metrics"
    assert out["docker"]["cmd"][-1] == mask(KEY)
    # a switch followed by another flag is not a value: nothing to hide
    assert command_line_secrets("--api-key --tp 8") == []
    # the two configurations differ by their keys' hashes, not by the keys
    assert mask_reported({"api_key": "sk-other-1234"})["api_key"] != out["api_key"]


def test_the_host_side_mask_is_the_policy_mask() -> None:
    assert masked(KEY) == mask(KEY)
    assert hide({"a": [f"x {KEY} y"]}, [KEY]) == {"a": [f"x {mask(KEY)} y"]}


def test_bench_frames_are_masked_across_records() -> None:
    run_id = "r1"
    lines = [
        f"GPUOPS-BENCH {run_id} server " + json.dumps({"server_info": {"api_key": KEY, "launch_command": f"--api-key {KEY}"}}),
        f"GPUOPS-BENCH {run_id} error " + json.dumps({"message": f"HTTP 401 for key {KEY}"}),
        f"GPUOPS-BENCH {run_id} end " + json.dumps({"partial": False}),
    ]
    run = parse_frames("\n".join(lines), run_id)
    text = json.dumps([run.server, run.errors])
    assert KEY not in text and mask(KEY) in run.errors[0]["message"]


def test_the_host_journal_keeps_a_quoted_command_line_masked(tmp_path) -> None:
    """The apply journal on the host (``remote/apply_run.Run.event``) masks with the same policy: a
    rollback's reason quoting the server's own command line (its flags checked against the launch
    script's, ``apply_service``) keeps its ``--api-key`` as the masked token."""
    from gpuops.remote.apply_journal import read_journal
    from gpuops.remote.apply_run import Run
    from gpuops.remote.host_protocol import ROLLED_BACK

    run = Run({"state_dir": str(tmp_path), "run_id": "r1"}, lambda record: None, None)
    why = f"the server (pid 7) does not run with the flags its launch script gives (-m sglang.launch_server --api-key {KEY} --tp 8)"
    run.event(ROLLED_BACK, error=why, restored=["/etc/gpuops/sglang.env"])
    text = (tmp_path / "journal.jsonl").read_text()
    assert KEY not in text and f"--api-key {mask(KEY)} --tp 8" in text
    records = read_journal(str(tmp_path))
    assert records[-1]["event"] == ROLLED_BACK and records[-1]["restored"] == ["/etc/gpuops/sglang.env"]


def test_the_apply_helpers_call_directory_keeps_no_secret_but_the_audit_as_read() -> None:
    """The worker's progress and result (progress.jsonl, result.json in its call directory on the
    host) pass the secrets policy; the gate re-audit's output (SGLang's source names api_key) does not."""
    from gpuops.remote.apply_helper import masked as call_record

    key = "sk-callsdir-9d2e7b"
    # as SGLang (and the lab's stand-in) log their arguments: the key is the first one
    log = f"[2026-12-01] server_args=ServerArgs(api_key='{key}', model_path='/m', tp_size=4)\nready"
    audit = "srt/server_args.py:120: api_key: Optional[str] = None  # gate source excerpt, kept"
    verified = call_record({"event": "verified", "pid": 7, "log": log, "audit_output": audit,
                       "checked": {"server_info": {"api_key": key, "launch_command": f"python -m sglang --api-key {key}"}}})
    assert key not in json.dumps(verified) and "<masked:" in verified["log"] and verified["log"].endswith("ready")
    assert verified["audit_output"] == audit and verified["pid"] == 7 and verified["event"] == "verified"
    result = call_record({"ok": False, "status": "rolled_back", "log_tail": log, "restored": ["/etc/x"], "audit_output": None})
    assert key not in json.dumps(result) and result["restored"] == ["/etc/x"] and result["ok"] is False



def test_the_relay_keeps_gpuops_messages_masked_in_the_calls_inbox(tmp_path) -> None:
    """A commit refused with a reason that quotes the server (the log line judged, a smoke answer)
    is kept in the call's inbox.jsonl masked; heartbeats are not written; the worker reads the rest."""
    import io

    from gpuops.remote.apply_helper import Relay

    key = "sk-inbox-4c1d8e"
    lines = [b'{"hb": 1}\n', json.dumps({"commit": False, "reason": f"logged server_args=ServerArgs(api_key='{key}')"}).encode() + b"\n",
             json.dumps({"verdict": True, "reason": "open"}).encode() + b"\n"]
    Relay(str(tmp_path)).read_client(io.BytesIO(b"".join(lines)))
    kept = [json.loads(line) for line in (tmp_path / "inbox.jsonl").read_text().splitlines()]
    assert key not in json.dumps(kept) and kept[0]["commit"] is False and "<masked:" in kept[0]["reason"]
    assert kept[1] == {"verdict": True, "reason": "open"} and (tmp_path / "client_gone").exists()
