"""Planning with fixtures alone: (facts, role, vars) -> changes. No host, no I/O beyond role files."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from gpuops.errors import GpuopsError
from gpuops.plan.model import FileState, PlanFacts
from gpuops.plan.planner import discover, plan_role, vars_digest
from gpuops.plan.roles import RoleError
from gpuops.plan.templating import TemplateError

STATE = "/srv/gpuops"
HOSTILE = "$(touch /tmp/pwned)"

BASE_VARS = {
    "sglang_manager": "process",
    "gpuops_state_dir": STATE,
    "sglang_python": "/opt/venv/bin/python",
    "sglang_args": ["--model-path", "/models/Kimi-K2.5", "--tp", "8", "--port", "30000"],
    "sglang_port": 30000,
    "sglang_env": {"NCCL_P2P_LEVEL": "SYS"},
}


def empty_facts(role: str, inventory: dict, extra: dict | None = None, host: str = "h01") -> PlanFacts:
    found = discover(role, host, inventory, extra or {})
    return PlanFacts(host=host, files={p: FileState(path=p, exists=False) for p in found.paths})


def facts_after(plan, base: PlanFacts) -> PlanFacts:
    """The host as it would be after applying ``plan`` (for idempotence)."""
    files = dict(base.files)
    for change in plan.changes:
        files[change.path] = FileState(path=change.path, exists=True, sha256=change.after_sha256,
                                       mode=change.mode, content=change.after)
    return PlanFacts(host=base.host, files=files)


def test_process_manager_renders_env_and_launch_script() -> None:
    facts = empty_facts("sglang-service", BASE_VARS)
    plan = plan_role("sglang-service", facts, BASE_VARS, {})
    by_path = {c.path: c for c in plan.changes}
    assert set(by_path) == {f"{STATE}/sglang.env", f"{STATE}/sglang-launch.sh"}
    env = by_path[f"{STATE}/sglang.env"]
    assert env.mode == "0600" and env.action == "create"
    assert "NCCL_P2P_LEVEL='SYS'\n" in env.after
    launch = by_path[f"{STATE}/sglang-launch.sh"].after
    assert launch.startswith("#!/bin/sh\n")
    assert f". {STATE}/sglang.env\n" in launch
    exec_line = [line for line in launch.splitlines() if line.startswith("exec ")][0]
    assert shlex.split(exec_line) == ["exec", "/opt/venv/bin/python", "-m", "sglang.launch_server",
                                      "--model-path", "/models/Kimi-K2.5", "--tp", "8", "--port", "30000"]
    assert [h.name for h in plan.handlers] == ["restart sglang"]
    assert plan.handlers[0].service.manager == "process"
    assert plan.handlers[0].service.state_dir == STATE and plan.handlers[0].service.port == 30000


def test_second_plan_on_the_result_changes_nothing_and_restarts_nothing() -> None:
    facts = empty_facts("sglang-service", BASE_VARS)
    first = plan_role("sglang-service", facts, BASE_VARS, {})
    second = plan_role("sglang-service", facts_after(first, facts), BASE_VARS, {})
    assert second.changes == ()
    assert second.handlers == ()
    assert second.service is not None  # still known, for rollback and health


def test_mode_drift_alone_is_a_change() -> None:
    facts = empty_facts("sglang-service", BASE_VARS)
    first = plan_role("sglang-service", facts, BASE_VARS, {})
    after = facts_after(first, facts)
    env_path = f"{STATE}/sglang.env"
    loose = dict(after.files)
    loose[env_path] = FileState(path=env_path, exists=True, mode="0644", content=after.files[env_path].content)
    plan = plan_role("sglang-service", PlanFacts("h01", loose), BASE_VARS, {})
    assert [(c.path, c.action, c.mode) for c in plan.changes] == [(env_path, "mode", "0600")]


def test_port_flag_added_only_when_missing() -> None:
    inventory = dict(BASE_VARS, sglang_args=["--model-path", "/m"], sglang_port=31000)
    plan = plan_role("sglang-service", empty_facts("sglang-service", inventory), inventory, {})
    launch = next(c.after for c in plan.changes if c.path.endswith("sglang-launch.sh"))
    assert launch.rstrip().endswith("--model-path /m --port 31000")


def test_hostile_values_stay_literal() -> None:
    inventory = dict(BASE_VARS, sglang_args=["--model-path", HOSTILE, "--served-model-name", "a'b; rm -rf /"])
    extra = {"sglang_env": {"SGLANG_NOTE": HOSTILE, "SGLANG_QUOTE": "it's `id`"}}
    plan = plan_role("sglang-service", empty_facts("sglang-service", inventory, extra), inventory, extra)
    env = next(c.after for c in plan.changes if c.path.endswith("sglang.env"))
    assert "SGLANG_NOTE='$(touch /tmp/pwned)'\n" in env
    # A quote in the value: double quotes, read alike by sh and systemd's EnvironmentFile=.
    assert 'SGLANG_QUOTE="it\'s \\`id\\`"\n' in env
    launch = next(c.after for c in plan.changes if c.path.endswith("sglang-launch.sh"))
    words = shlex.split([line for line in launch.splitlines() if line.startswith("exec ")][0])
    assert HOSTILE in words and "a'b; rm -rf /" in words


def test_inventory_and_extra_values_are_data_not_templates() -> None:
    extra = {"sglang_env": {"SGLANG_X": "{{ gpuops_state_dir }}"}}
    plan = plan_role("sglang-service", empty_facts("sglang-service", BASE_VARS, extra), BASE_VARS, extra)
    env = next(c.after for c in plan.changes if c.path.endswith("sglang.env"))
    assert "SGLANG_X='{{ gpuops_state_dir }}'" in env


def test_precedence_defaults_inventory_extra() -> None:
    inventory = dict(BASE_VARS)
    del inventory["gpuops_state_dir"]
    found = discover("sglang-service", "h01", inventory, {})
    assert found.state_dir == "/var/lib/gpuops"          # role default
    found = discover("sglang-service", "h01", dict(inventory, gpuops_state_dir="/a"), {})
    assert found.state_dir == "/a"                       # inventory beats the default
    found = discover("sglang-service", "h01", dict(inventory, gpuops_state_dir="/a"), {"gpuops_state_dir": "/b"})
    assert found.state_dir == "/b"                       # -e beats the inventory
    assert found.paths == ("/b/desired.json", "/b/sglang-launch.sh", "/b/sglang.env")


def test_nccl_env_merges_over_sglang_env_and_bad_names_are_refused_early() -> None:
    extra = {"nccl_env": {"NCCL_P2P_LEVEL": "PHB", "NCCL_MIN_NCHANNELS": 8}}
    plan = plan_role("nccl-env", empty_facts("nccl-env", BASE_VARS, extra), BASE_VARS, extra)
    env = next(c.after for c in plan.changes if c.path.endswith("sglang.env"))
    assert "NCCL_P2P_LEVEL='PHB'" in env and "NCCL_MIN_NCHANNELS='8'" in env and "'SYS'" not in env
    with pytest.raises(GpuopsError, match="did you mean NCCL_ALGO"):
        discover("nccl-env", "h01", BASE_VARS, {"nccl_env": {"NCCL_ALGOS": "Ring"}})
    with pytest.raises(GpuopsError, match="LL, LL128, Simple"):
        discover("nccl-env", "h01", BASE_VARS, {"nccl_env": {"NCCL_PROTO": "fast"}})
    with pytest.raises(GpuopsError, match="nccl_env must map NCCL_"):
        discover("nccl-env", "h01", BASE_VARS, {"nccl_env": {"ALGO": "Ring"}})


def test_tree_is_warned_about() -> None:
    extra = {"nccl_env": {"NCCL_ALGO": "Tree"}}
    plan = plan_role("nccl-env", empty_facts("nccl-env", BASE_VARS, extra), BASE_VARS, extra)
    assert any("CUDA graph capture" in w for w in plan.warnings)


def test_secrets_are_masked_in_diffs_but_written_to_the_host() -> None:
    extra = {"sglang_env": {"HF_TOKEN": "hf_abcdefghijkl", "SGLANG_API_KEY": "sk-secret-value"}}
    plan = plan_role("sglang-service", empty_facts("sglang-service", BASE_VARS, extra), BASE_VARS, extra)
    env = next(c for c in plan.changes if c.path.endswith("sglang.env"))
    assert "hf_abcdefghijkl" in env.after and "sk-secret-value" in env.after
    assert "hf_abcdefghijkl" not in env.diff and "sk-secret-value" not in env.diff
    assert "HF_TOKEN='<masked:" in env.diff
    summary = str(env.summary())
    assert "hf_abcdefghijkl" not in summary


def test_systemd_unit_and_daemon_reload() -> None:
    inventory = dict(BASE_VARS, sglang_manager="systemd", sglang_service="sglang-kimi")
    plan = plan_role("sglang-service", empty_facts("sglang-service", inventory), inventory, {})
    paths = {c.path for c in plan.changes}
    drop_in = "/etc/systemd/system/sglang-kimi.service.d/gpuops-env.conf"
    assert paths == {"/etc/systemd/system/sglang-kimi.service", drop_in, f"{STATE}/sglang.env"}
    unit = next(c.after for c in plan.changes if c.path.endswith(".service"))
    # The environment is the drop-in's: the unit names no EnvironmentFile= of its own.
    assert "EnvironmentFile=" not in unit.replace("(EnvironmentFile=)", "")
    assert next(c.after for c in plan.changes if c.path == drop_in).splitlines()[-2:] == [
        "[Service]", f"EnvironmentFile={STATE}/sglang.env"]
    assert 'ExecStart="/opt/venv/bin/python" -m sglang.launch_server "--model-path"' in unit
    assert plan.handlers[0].service.name == "sglang-kimi.service" and plan.handlers[0].daemon_reload


def test_a_changed_drop_in_alone_reloads_systemd() -> None:
    inventory = dict(BASE_VARS, sglang_manager="systemd")
    first = plan_role("sglang-service", empty_facts("sglang-service", inventory), inventory, {})
    # A host with this unit and env file but the drop-in missing (a unit from before the drop-in).
    drop_in = "/etc/systemd/system/sglang.service.d/gpuops-env.conf"
    after = facts_after(first, empty_facts("sglang-service", inventory))
    facts = PlanFacts(host=after.host, files={**after.files, drop_in: FileState(path=drop_in, exists=False)})
    plan = plan_role("sglang-service", facts, inventory, {})
    assert [c.path for c in plan.changes] == [drop_in]
    assert plan.handlers and plan.handlers[0].daemon_reload


def test_systemd_quoting_of_hostile_args() -> None:
    inventory = dict(BASE_VARS, sglang_manager="systemd", sglang_args=["--x", 'a"b $HOME 100%'])
    plan = plan_role("sglang-service", empty_facts("sglang-service", inventory), inventory, {})
    unit = next(c.after for c in plan.changes if c.path.endswith(".service"))
    assert '"a\\"b $$HOME 100%%"' in unit


def test_docker_env_file_is_verbatim_and_run_script_quoted() -> None:
    inventory = dict(BASE_VARS, sglang_manager="docker", sglang_service="sgl",
                     sglang_env={"SGLANG_NOTE": HOSTILE})
    plan = plan_role("sglang-service", empty_facts("sglang-service", inventory), inventory, {})
    by_path = {c.path: c.after for c in plan.changes}
    assert set(by_path) == {f"{STATE}/sglang.docker.env", f"{STATE}/sglang-docker-run.sh"}
    assert f"SGLANG_NOTE={HOSTILE}\n" in by_path[f"{STATE}/sglang.docker.env"]
    run = by_path[f"{STATE}/sglang-docker-run.sh"]
    words = shlex.split(run.splitlines()[-1])
    assert words[:6] == ["exec", "docker", "run", "-d", "--name", "sgl"]
    assert f"{STATE}/sglang.docker.env" in words and "lmsysorg/sglang:latest" in words
    assert plan.handlers[0].service.docker_run_script == f"{STATE}/sglang-docker-run.sh"


def test_unknown_manager_is_refused() -> None:
    with pytest.raises(GpuopsError, match="sglang_manager must be systemd, docker or process"):
        discover("sglang-service", "h01", dict(BASE_VARS, sglang_manager="supervisord"), {})


def test_bad_env_name_is_refused() -> None:
    with pytest.raises(GpuopsError, match="not a valid environment variable name"):
        discover("sglang-service", "h01", dict(BASE_VARS, sglang_env={"BAD;NAME": "1"}), {})
    with pytest.raises(GpuopsError, match="newline"):
        discover("sglang-service", "h01", dict(BASE_VARS, sglang_env={"X": "a\nb"}), {})


def test_vars_digest_is_stable_and_sensitive() -> None:
    assert vars_digest({"a": 1}, {"b": 2}) == vars_digest({"a": 1}, {"b": 2})
    assert vars_digest({"a": 1}, {"b": 2}) != vars_digest({"a": 1}, {"b": 3})


# ---------------------------------------------------------------- custom roles (tmp dirs)


def write_role(base: Path, name: str, tasks: str, defaults: str = "", handlers: str = "",
               templates: dict[str, str] | None = None) -> None:
    role = base / name
    role.mkdir(parents=True)
    (role / "tasks.yml").write_text(tasks)
    if defaults:
        (role / "defaults.yml").write_text(defaults)
    if handlers:
        (role / "handlers.yml").write_text(handlers)
    for fname, text in (templates or {}).items():
        (role / "templates").mkdir(exist_ok=True)
        (role / "templates" / fname).write_text(text)


def test_undefined_variable_names_itself_and_the_template(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- name: conf\n  template: {src: conf.j2, dest: /etc/x.conf}\n",
               templates={"conf.j2": "value={{ missing_thing }}\n"})
    facts = PlanFacts("h01", {"/etc/x.conf": FileState("/etc/x.conf", False)})
    with pytest.raises(TemplateError) as info:
        plan_role("r", facts, {}, {}, roles_path=[tmp_path])
    assert "missing_thing" in str(info.value) and "conf.j2" in str(info.value)


def test_unknown_module_names_the_role_file(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- name: x\n  shell: rm -rf /\n")
    with pytest.raises(RoleError) as info:
        discover("r", "h01", {}, {}, roles_path=[tmp_path])
    assert "tasks.yml" in str(info.value) and "'shell'" in str(info.value)


def test_unknown_key_of_a_module(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- template: {src: a, dest: /b, owner: root}\n")
    with pytest.raises(RoleError, match="unknown key 'owner' for template"):
        discover("r", "h01", {}, {}, roles_path=[tmp_path])


def test_when_register_and_lineinfile(tmp_path: Path) -> None:
    write_role(
        tmp_path, "r",
        "- name: limits\n  lineinfile: {path: /etc/limits, regexp: '^nofile', line: 'nofile 65536'}\n"
        "  register: limits\n"
        "- name: only when asked\n  fail: {msg: 'refused {{ reason }}'}\n  when: limits.changed and stop_now\n",
        defaults="stop_now: false\nreason: x\n",
    )
    facts = PlanFacts("h01", {"/etc/limits": FileState("/etc/limits", True, mode="0644", content="a\nnofile 1024\n")})
    plan = plan_role("r", facts, {}, {}, roles_path=[tmp_path])
    assert plan.changes[0].after == "a\nnofile 65536\n"
    assert plan.tasks_ok == 1
    with pytest.raises(GpuopsError, match="refused because"):
        plan_role("r", facts, {}, {"stop_now": True, "reason": "because"}, roles_path=[tmp_path])


def test_notify_without_a_handler_is_an_error(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- env: {dest: /x.env, entries: {A: 1}}\n  notify: restart nothing\n")
    facts = PlanFacts("h01", {"/x.env": FileState("/x.env", False)})
    with pytest.raises(RoleError, match="restart nothing"):
        plan_role("r", facts, {}, {}, roles_path=[tmp_path])


def test_default_referring_to_itself_is_reported(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- env: {dest: '{{ a }}', entries: {}}\n", defaults="a: '{{ b }}'\nb: '{{ a }}'\n")
    with pytest.raises(TemplateError, match="refers to itself"):
        discover("r", "h01", {}, {}, roles_path=[tmp_path])


def test_relative_destination_is_refused(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- env: {dest: 'etc/x.env', entries: {}}\n")
    with pytest.raises(GpuopsError, match="absolute path"):
        discover("r", "h01", {}, {}, roles_path=[tmp_path])


def test_nccl_allow_unknown_lets_a_newer_variable_through() -> None:
    extra = {"nccl_env": {"NCCL_FUTURE_KNOB": "1"}}
    with pytest.raises(GpuopsError, match="unknown NCCL variable NCCL_FUTURE_KNOB"):
        discover("nccl-env", "h01", BASE_VARS, extra)
    found = discover("nccl-env", "h01", BASE_VARS, dict(extra, nccl_allow_unknown=["NCCL_FUTURE_KNOB"]))
    assert found.paths


def test_templars_over_the_same_dirs_compile_each_source_once_and_see_edited_files(tmp_path: Path) -> None:
    # discover and plan_role each make a Templar: the second reuses what the first compiled.
    from gpuops.plan.templating import Layer, Templar, VarScope

    ours, other = tmp_path / "ours", tmp_path / "other"
    ours.mkdir()
    other.mkdir()
    (ours / "unit.j2").write_text("port={{ port }}\n")
    (other / "unit.j2").write_text("other {{ port }}\n")
    first, second, elsewhere = Templar([ours]), Templar([ours]), Templar([other])
    scope = VarScope(first, [Layer({"port": 30000, "args": ["--a"]}, templated=False, origin="inventory")])
    assert first.evaluate("args + ['--b']", scope, "t") == ["--a", "--b"]
    assert second._expressions is first._expressions and "args + ['--b']" in second._expressions
    assert elsewhere._expressions is not first._expressions
    assert second.render_string("at {{ port }}", scope, "t") == "at 30000"
    assert first.render_file("unit.j2", scope, "t") == "port=30000\n"
    assert elsewhere.render_file("unit.j2", scope, "t") == "other 30000\n"  # its own dirs, not the shared ones
    unit = ours / "unit.j2"
    unit.write_text("port={{ port }} edited\n")
    later = unit.stat().st_mtime_ns + 2_000_000_000
    os.utime(unit, ns=(later, later))
    assert Templar([ours]).render_file("unit.j2", scope, "t") == "port=30000 edited\n"
