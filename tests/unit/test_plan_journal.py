"""Pure pieces of apply: journal folding, payloads, verdict helpers, env files, redaction."""

from __future__ import annotations

import base64

import pytest

from gpuops.apply.journal import fold_runs
from gpuops.apply.payload import apply_payload
from gpuops.apply.verdict import compute_capability_of
from gpuops.plan.envfile import render_env_file
from gpuops.plan.model import Change, HandlerRun, Plan, ServiceSpec
from gpuops.secret_policy import is_secret_name, mask, mask_mapping, secret_values


def test_fold_runs_outcomes() -> None:
    records = [
        {"run_id": "a", "event": "started", "time": "t1", "role": "nccl-env", "user": "me",
         "changes": [{"path": "/x", "after_sha256": "1"}]},
        {"run_id": "a", "event": "finished", "time": "t2"},
        {"run_id": "b", "event": "unchanged", "time": "t3", "role": "nccl-env", "changes": []},
        {"run_id": "c", "event": "started", "time": "t4", "role": "fusion-sm120", "changes": [{"path": "/y"}]},
        {"run_id": "c", "event": "audited", "time": "t5"},
        {"run_id": "d", "event": "started", "time": "t6", "kind": "rollback", "target": "a", "changes": [{"path": "/x"}]},
        {"run_id": "d", "event": "finished", "time": "t7"},
        {"event": "garbage"},
    ]
    runs = {r["run_id"]: r for r in fold_runs(records)}
    assert runs["a"]["outcome"] == "finished" and runs["a"]["changed"] == 1 and runs["a"]["time"] == "t1"
    assert runs["b"]["outcome"] == "unchanged" and runs["b"]["changed"] == 0
    assert runs["c"]["outcome"] == "unfinished (audited)"
    assert runs["d"]["kind"] == "rollback" and runs["d"]["target"] == "a"
    assert list(runs) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("end", ["finished", "rolled_back", "unchanged", "reverted_by_rollback", "rollback_failed",
                                 "server_touched", None])
def test_host_and_home_agree_on_when_a_run_has_ended(end) -> None:
    """The client folds the host's journal with the host's own schema (remote/apply_journal.py): a run
    the host would recover as unfinished is unfinished at home too, and the other way round."""
    from gpuops.apply import journal as home
    from gpuops.remote import apply_journal as host

    records = [{"run_id": "r", "event": "started", "time": "t1", "changes": [{"path": "/x"}]}]
    if end:
        records.append({"run_id": "r", "event": end, "time": "t2"})
    open_on_host = bool(host.unfinished_runs(records))
    (run,) = fold_runs(records)
    assert open_on_host == run["outcome"].startswith("unfinished")
    assert open_on_host == (end not in ("finished", "rolled_back", "unchanged", "reverted_by_rollback"))
    assert home.TERMINAL_EVENTS is host.TERMINAL_EVENTS  # one list, not a copy that can drift


def test_bench_names_the_patches_in_place_from_the_apply_journal(tmp_path) -> None:
    """The bench client reads the host's journal with the apply helper's reader: a finished run's
    sglang change still in place counts; a rolled-back run, a changed file, a torn line do not."""
    import hashlib
    import json

    from gpuops.remote.bench_snapshot import patched_sources

    tree = tmp_path / "site" / "sglang" / "srt"
    tree.mkdir(parents=True)
    kept, edited, undone = tree / "kept.py", tree / "edited.py", tree / "undone.py"
    for path in (kept, edited, undone):
        path.write_text("patched\n")
    sha = hashlib.sha256(b"patched\n").hexdigest()
    edited.write_text("edited by hand since\n")

    def run(run_id, role, path, *ends):
        started = {"run_id": run_id, "event": "started", "time": "t", "role": role,
                   "changes": [{"path": str(path), "after_sha256": sha}]}
        return [started] + [{"run_id": run_id, "event": e, "time": "t"} for e in ends]

    records = (run("a", "fusion-sm120", kept, "finished") + run("b", "x", edited, "finished")
               + run("c", "y", undone, "rolled_back") + run("d", "z", undone))
    state = tmp_path / "state"
    state.mkdir()
    lines = [json.dumps(r) for r in records] + ['[1, 2]', '{"run_id": "torn", "ev']
    (state / "journal.jsonl").write_text("\n".join(lines) + "\n")
    assert patched_sources(str(state)) == ["fusion-sm120:sglang/srt/kept.py"]
    assert patched_sources(str(tmp_path / "nowhere")) == [] and patched_sources(None) == []


def test_payload_carries_bytes_and_hashes_not_diffs() -> None:
    service = ServiceSpec("process", "sglang", "/s", 30000, 60.0, 5.0)
    change = Change(kind="env", path="/s/sglang.env", action="update", before="A='1'\n", after="A='2'\n",
                    diff="-A\n+A\n", mode="0600", task="t", notify=("restart sglang",))
    plan = Plan(host="h", role="nccl-env", changes=(change,), handlers=(HandlerRun("restart sglang", service),),
                service=service, state_dir="/s")
    payload = apply_payload(plan, "r1", "digest", None)
    (entry,) = payload["changes"]
    assert base64.b64decode(entry["after_b64"]).decode() == "A='2'\n"
    assert entry["before_sha256"] == change.before_sha256 and entry["mode"] == "0600"
    assert "diff" not in entry and payload["audit"] is None
    assert payload["handlers"] == [{"name": "restart sglang", "daemon_reload": False}]
    assert payload["service"]["port"] == 30000 and payload["meta"]["vars_sha256"] == "digest"


@pytest.mark.parametrize("sm, cc", [("sm120", "12.0"), ("sm121", "12.1"), ("sm90", "9.0"), ("SM100", "10.0"), ("sm103", "10.3")])
def test_compute_capability_of(sm: str, cc: str) -> None:
    assert compute_capability_of(sm) == cc


def test_env_file_is_sorted_and_quoted() -> None:
    text = render_env_file({"B": "it's", "A": "$(x)"}, "header\nline two")
    assert text == "# header\n# line two\nA='$(x)'\nB=\"it's\"\n"
    assert render_env_file({"A": "$(x)"}, "h", style="docker") == "# h\nA=$(x)\n"


def test_secret_names() -> None:
    for name in ("HF_TOKEN", "hf_token", "SGLANG_API_KEY", "db_password", "client_secret", "GITHUB_TOKEN"):
        assert is_secret_name(name), name
    for name in ("ansible_ssh_private_key_file", "NCCL_P2P_LEVEL", "sglang_port", "gpuops_known_hosts"):
        assert not is_secret_name(name), name
    values = secret_values({"sglang_env": {"HF_TOKEN": "hf_abcdef", "X": "plain"}, "api_key": "k"})
    assert values == ["hf_abcdef"]  # one-letter values are never masked (they would mask digits everywhere)
    assert mask_mapping({"sglang_env": {"HF_TOKEN": "hf_abcdef", "X": "plain"}}) == {
        "sglang_env": {"HF_TOKEN": mask("hf_abcdef"), "X": "plain"}}
