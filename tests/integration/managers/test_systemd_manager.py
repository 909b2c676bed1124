"""sglang_manager: systemd, against real systemd (PID 1 of a booted Debian root, reached over SSH).

One host for the module (booting costs about a second); every test leaves it as it found it:
the unit active with the original flags and environment. What systemd really runs is read from
systemd itself (`systemctl show`, the unit's processes), never from the files gpuops wrote.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from typing import Any

import pytest
from labtools import client_paused_at, rolled_back_count, server_info, wait_for_self_rollback, wait_server_info

pytestmark = pytest.mark.integration

UNIT = "/etc/systemd/system/sglang.service"
ENV = "/var/lib/gpuops/sglang.env"
DROP_IN = "/etc/systemd/system/sglang.service.d/gpuops-env.conf"  # the unit's EnvironmentFile=
# Read differently by sh and by systemd's EnvironmentFile= unless quoted for both.
HOSTILE = "it's \\ a $HOME \"q\" `id` $(id); x"


@pytest.fixture(scope="module")
def host(systemd_host_factory):
    booted = systemd_host_factory(server_env={"GPUOPS_STANDIN_CRASH_IF": "NCCL_MIN_NCHANNELS=13", "NCCL_DEBUG": "WARN"})
    yield booted
    booted.stop()  # not held until the end of a long session


def apply(run_gpuops, host, *args: str) -> subprocess.CompletedProcess:
    return run_gpuops("apply", *args, "-i", str(host.inventory_path), "--json", "-e", "gpuops_health_timeout=30",
                      "-e", "gpuops_stop_grace=5", env={"XDG_STATE_HOME": ""})


def report_of(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    try:
        return json.loads(proc.stdout)["hosts"]["sd1"]
    except (ValueError, KeyError):
        raise AssertionError(f"no JSON report: {proc.stdout}\n{proc.stderr}") from None


def files(host) -> dict[str, str | None]:
    """sha256 of each launch file (None: absent)."""
    return {p: hashlib.sha256(host.booted.path(p).read_bytes()).hexdigest() if host.booted.path(p).exists() else None
            for p in (UNIT, ENV, DROP_IN)}


def served(host, timeout: float = 30) -> dict[str, Any]:
    return wait_server_info(host.server_port, timeout)


def original_env(host) -> dict[str, str]:
    return {"GPUOPS_STANDIN_CRASH_IF": "NCCL_MIN_NCHANNELS=13", "NCCL_DEBUG": "WARN"}


def test_environment_reaches_the_server_as_written_then_rerun_restarts_nothing(host, run_gpuops) -> None:
    before = files(host)
    first_pid = host.systemctl_show("MainPID")["MainPID"]
    env = {**original_env(host), "SGLANG_NOTE": HOSTILE}
    extra = json.dumps({"sglang_env": env})
    proc = apply(run_gpuops, host, "sglang-service", "-e", extra)
    report = report_of(proc)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    assert [c["path"] for c in report["changes"]] == [ENV]
    shown = host.systemctl_show("MainPID", "NRestarts", "InvocationID", "ActiveState")
    assert shown["ActiveState"] == "active" and shown["MainPID"] != first_pid
    assert report["pid"] == int(shown["MainPID"])
    # systemd read the env file as the bytes gpuops meant (sh's '\'' would not survive it).
    assert served(host)["env"]["SGLANG_NOTE"] == HOSTILE

    again = apply(run_gpuops, host, "sglang-service", "-e", extra)
    second = report_of(again)
    assert again.returncode == 0 and second["changed"] == 0 and second["status"] == "unchanged"
    assert host.systemctl_show("MainPID", "NRestarts", "InvocationID", "ActiveState") == shown  # not restarted

    back = run_gpuops("rollback", "-i", str(host.inventory_path), env={"XDG_STATE_HOME": ""})
    assert back.returncode == 0, back.stdout + back.stderr
    assert files(host) == before
    assert "SGLANG_NOTE" not in served(host)["env"]


def test_new_flags_rewrite_the_unit_reload_and_rollback_restores_it_byte_for_byte(host, run_gpuops) -> None:
    before = files(host)
    unit_before = host.booted.path(UNIT).read_bytes()
    old_exec = host.systemctl_show("ExecStart")["ExecStart"]
    args = json.dumps({"sglang_args": ["--model-path", "/models/stand-in", "--tp", "1", "--max-running-requests", "5"]})
    proc = apply(run_gpuops, host, "sglang-service", "-e", args)
    report = report_of(proc)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    assert [c["path"] for c in report["changes"]] == [UNIT]
    shown = host.systemctl_show("ExecStart", "NeedDaemonReload", "MainPID")
    assert "--max-running-requests 5" in shown["ExecStart"] and shown["NeedDaemonReload"] == "no"
    assert served(host)["max_running_requests"] == 5

    back = run_gpuops("rollback", "-i", str(host.inventory_path), env={"XDG_STATE_HOME": ""})
    assert back.returncode == 0, back.stdout + back.stderr
    assert files(host) == before and host.booted.path(UNIT).read_bytes() == unit_before
    shown = host.systemctl_show("ExecStart", "NeedDaemonReload", "ActiveState")
    assert shown["NeedDaemonReload"] == "no" and shown["ActiveState"] == "active"
    assert shown["ExecStart"].split(" ; start_time")[0] == old_exec.split(" ; start_time")[0]
    assert served(host).get("max_running_requests") != 5


def test_a_server_systemd_keeps_restarting_is_a_failed_start_and_rolls_back(host, run_gpuops) -> None:
    before = files(host)
    proc = apply(run_gpuops, host, "nccl-env", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 13}}')
    report = report_of(proc)
    assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
    assert "systemd" in report["error"] and "Restart=on-failure" in report["error"]
    # The failure shows the unit's journal: the stand-in's own last words.
    assert "NCCL" in (report.get("log_tail") or "") and "sglang" in (report.get("log_tail") or "").lower()
    assert files(host) == before
    shown = host.systemctl_show("ActiveState", "SubState", "MainPID")
    assert (shown["ActiveState"], shown["SubState"]) == ("active", "running")
    info = served(host)
    assert info["env"].get("NCCL_MIN_NCHANNELS") is None and info["env"]["NCCL_DEBUG"] == "WARN"


def test_a_unit_systemd_rejects_is_rolled_back(host, run_gpuops) -> None:
    before = files(host)
    # Neither an absolute path nor a bare name: systemd refuses the ExecStart= line.
    proc = apply(run_gpuops, host, "sglang-service", "-e", "sglang_python=bin/python3")
    report = report_of(proc)
    assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
    assert files(host) == before
    shown = host.systemctl_show("ActiveState", "MainPID", "LoadState", "NeedDaemonReload")
    assert shown["ActiveState"] == "active" and shown["LoadState"] == "loaded" and shown["NeedDaemonReload"] == "no"
    assert "bad-setting" in report["error"] and "Neither a valid executable name" in report["log_tail"]
    assert served(host)["env"]["NCCL_DEBUG"] == "WARN"


def test_inspect_reports_what_systemd_runs_including_an_operator_drop_in(host, run_gpuops) -> None:
    # An operator's drop-in: an extra Environment= and a second EnvironmentFile= that gpuops did
    # not write. inspect must show them, from systemd, next to what the server really got.
    drop_in = host.booted.path("/etc/systemd/system/sglang.service.d/operator.conf")
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    extra_env = host.booted.path("/etc/sglang-extra.env")
    extra_env.write_text("SGLANG_FROM_EXTRA=two words\n")
    drop_in.write_text('[Service]\nEnvironment="SGLANG_OPERATOR=on call" NCCL_IB_DISABLE=1\n'
                       "EnvironmentFile=-/etc/sglang-extra.env\n")
    try:
        assert host.booted.run(["systemctl", "daemon-reload"]).returncode == 0
        assert host.booted.run(["systemctl", "restart", host.unit]).returncode == 0
        served(host)
        proc = run_gpuops("inspect", "host", "-i", str(host.inventory_path), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        server = json.loads(proc.stdout)["hosts"]["sd1"]["facts"]["server"]
        shown = host.systemctl_show("MainPID", "NRestarts", "ExecStart", "DropInPaths", "FragmentPath", "Restart")
        unit = server["systemd"]
        assert server["manager"] == "systemd" and server["unit"] == "sglang.service"
        assert unit["unit"] == "sglang.service" and (unit["active_state"], unit["sub_state"]) == ("active", "running")
        assert unit["main_pid"] == int(shown["MainPID"]) and unit["n_restarts"] == int(shown["NRestarts"])
        assert unit["exec_start"] == shown["ExecStart"]
        assert unit["exec_argv"].startswith("/usr/local/bin/python-sglang -m sglang.launch_server")
        assert unit["drop_ins"] == shown["DropInPaths"].split() == [
            DROP_IN, "/etc/systemd/system/sglang.service.d/operator.conf"]
        assert unit["fragment_path"] == shown["FragmentPath"] and unit["restart"] == shown["Restart"] == "on-failure"
        assert unit["environment"] == ["SGLANG_OPERATOR=on call", "NCCL_IB_DISABLE=1"]
        assert unit["environment_files"] == ["/var/lib/gpuops/sglang.env", "/etc/sglang-extra.env"]
        # ... and the process got all three sources.
        assert {k: server["env"].get(k) for k in ("SGLANG_OPERATOR", "NCCL_IB_DISABLE", "SGLANG_FROM_EXTRA", "NCCL_DEBUG")} == {
            "SGLANG_OPERATOR": "on call", "NCCL_IB_DISABLE": "1", "SGLANG_FROM_EXTRA": "two words", "NCCL_DEBUG": "WARN"}
        text = run_gpuops("inspect", "host", "-v", "-i", str(host.inventory_path)).stdout
        assert "systemd: sglang.service active/running" in text and f"drop-ins {DROP_IN} /etc/systemd/system/sglang.service.d/operator.conf" in text
    finally:
        drop_in.unlink(missing_ok=True)
        extra_env.unlink(missing_ok=True)
        host.booted.run(["systemctl", "daemon-reload"])
        host.booted.run(["systemctl", "restart", host.unit])
        served(host)


def test_user_and_working_directory_are_what_systemd_runs_and_roll_back(host, run_gpuops) -> None:
    before = files(host)
    proc = apply(run_gpuops, host, "sglang-service", "-e", "sglang_user=nobody", "-e", "sglang_working_directory=/tmp")
    report = report_of(proc)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    shown = host.systemctl_show("User", "WorkingDirectory", "MainPID")
    assert (shown["User"], shown["WorkingDirectory"]) == ("nobody", "/tmp")
    status = host.booted.run(["cat", f"/proc/{shown['MainPID']}/status"]).stdout
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert uid == host.booted.run(["id", "-u", "nobody"]).stdout.strip()
    assert host.booted.run(["readlink", f"/proc/{shown['MainPID']}/cwd"]).stdout.strip() == "/tmp"
    # The port check held: the server that answers is the unit's, running as nobody.
    assert report["pid"] == int(shown["MainPID"])

    # A newline would smuggle a directive into the unit: refused before anything changes.
    refused = apply(run_gpuops, host, "sglang-service", "-e",
                    json.dumps({"sglang_working_directory": "/tmp\nExecStartPre=/bin/false"}))
    assert refused.returncode == 2 and "sglang_working_directory" in refused.stderr

    back = run_gpuops("rollback", "-i", str(host.inventory_path), env={"XDG_STATE_HOME": ""})
    assert back.returncode == 0, back.stdout + back.stderr
    assert files(host) == before
    assert host.systemctl_show("User", "WorkingDirectory") == {"User": "", "WorkingDirectory": ""}
    served(host)


def test_a_run_that_moves_the_port_rolls_back_to_the_old_one(host, run_gpuops) -> None:
    from gpuops.lab.sshd import free_port

    before = files(host)
    new_port = free_port()
    proc = apply(run_gpuops, host, "sglang-service", "-e", f"sglang_port={new_port}")
    report = report_of(proc)
    assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
    assert server_info(new_port)["port"] == new_port
    # The rollback must wait for the previous server where the restored unit puts it, not on
    # the port of the run it undoes.
    back = run_gpuops("rollback", "-i", str(host.inventory_path), env={"XDG_STATE_HOME": ""})
    assert back.returncode == 0, back.stdout + back.stderr
    assert files(host) == before
    assert served(host)["port"] == host.server_port
    with pytest.raises(OSError):
        server_info(new_port)


def test_a_port_answered_by_another_process_is_not_the_units_server(host, run_gpuops) -> None:
    import sys

    from gpuops.lab.sshd import free_port
    from gpuops.lab.systemd_host import STANDIN

    before = files(host)
    port = free_port()
    # An imposter outside the container answers /health on the port the run moves the server to.
    imposter = subprocess.Popen([sys.executable, str(STANDIN), "-m", "sglang.launch_server", "--model-path", "/m",
                                 "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                server_info(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "the imposter never answered"
                time.sleep(0.1)
        proc = apply(run_gpuops, host, "sglang-service", "-e", f"sglang_port={port}")
        report = report_of(proc)
        assert proc.returncode == 1 and report["status"] == "rolled_back", proc.stdout + proc.stderr
        assert "another process holds the port" in report["error"] or "exited" in report["error"]
        assert files(host) == before
        assert served(host)["port"] == host.server_port
        assert imposter.poll() is None  # gpuops never touched a process that is not the unit's
    finally:
        imposter.terminate()
        imposter.wait(timeout=30)


def test_client_killed_during_the_health_wait_the_host_rolls_back_by_itself(host, gpuops_home) -> None:
    # The transaction's lease under systemd: gpuops vanishes (kill -9) after the unit's server was
    # restarted with the new environment; the host-side worker restores the env file and brings
    # the previous server back through systemd on its own.
    import signal

    before = files(host)
    old_pid = host.systemctl_show("MainPID")["MainPID"]
    state = host.booted.path("/var/lib/gpuops")
    rolled_back_before = rolled_back_count(state)
    client = client_paused_at(state, "health", ["apply", "nccl-env", "-i", str(host.inventory_path), "-e", "gpuops_lease=4",
                                                "-e", "gpuops_health_timeout=60",
                                                "-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": 8}})], gpuops_home, 120)
    try:
        # Paused after the restart: systemd runs the new server now.
        assert host.systemctl_show("MainPID")["MainPID"] != old_pid
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    deadline = time.monotonic() + 4 + 60  # the lease, then the previous server's restart
    wait_for_self_rollback(state / "lock", lambda: rolled_back_count(state) > rolled_back_before, deadline)
    assert files(host) == before
    info = served(host)
    assert "NCCL_MIN_NCHANNELS" not in info["env"] and info["env"]["NCCL_DEBUG"] == "WARN"
    assert host.systemctl_show("ActiveState")["ActiveState"] == "active"


def put_back_lab_files(host, lab_files: dict[str, str]) -> None:
    """The lab's unit and drop-in as the host started with, loaded and running (a test's cleanup)."""
    for path, text in lab_files.items():
        host.booted.path(path).parent.mkdir(parents=True, exist_ok=True)
        host.booted.path(path).write_text(text)
    host.booted.run(["systemctl", "daemon-reload"])
    host.booted.run(["systemctl", "restart", host.unit])
    served(host)


def test_the_environment_is_a_drop_in_of_its_own_and_an_old_unit_rolls_back_byte_for_byte(host, run_gpuops) -> None:
    from gpuops.lab.systemd_host import GROUP_VARS, render_service_files

    lab_files = render_service_files({**GROUP_VARS, **host.host_vars})
    assert "EnvironmentFile=" not in lab_files[UNIT].split("[Unit]", 1)[1]
    assert lab_files[DROP_IN].endswith(f"[Service]\nEnvironmentFile={ENV}\n")
    shown = host.systemctl_show("DropInPaths", "EnvironmentFiles")
    assert shown["DropInPaths"] == DROP_IN and shown["EnvironmentFiles"].startswith(ENV + " ")

    # A host set up before the drop-in: the unit names the env file itself. An operator's drop-in
    # sits beside it. The next env change moves the env file to gpuops' drop-in, reloads systemd,
    # and leaves the operator's drop-in alone; rollback puts back the old unit and no drop-in.
    unit_path, drop_in, operator = host.booted.path(UNIT), host.booted.path(DROP_IN), host.booted.path(
        "/etc/systemd/system/sglang.service.d/operator.conf")
    old_unit = lab_files[UNIT].replace("ExecStart=", f"EnvironmentFile={ENV}\nExecStart=", 1).encode()
    unit_path.write_bytes(old_unit)
    drop_in.unlink()
    operator.write_text("[Service]\nEnvironment=SGLANG_OPERATOR=kept\n")
    try:
        assert host.booted.run(["systemctl", "daemon-reload"]).returncode == 0
        assert host.booted.run(["systemctl", "restart", host.unit]).returncode == 0
        assert served(host)["env"]["SGLANG_OPERATOR"] == "kept"
        before = files(host)
        assert before[DROP_IN] is None
        env = {**original_env(host), "SGLANG_NOTE": HOSTILE}
        proc = apply(run_gpuops, host, "sglang-service", "-e", json.dumps({"sglang_env": env}))
        report = report_of(proc)
        assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
        assert sorted(c["path"] for c in report["changes"]) == sorted([UNIT, DROP_IN, ENV])
        assert unit_path.read_bytes() == lab_files[UNIT].encode() and drop_in.read_text() == lab_files[DROP_IN]
        shown = host.systemctl_show("DropInPaths", "EnvironmentFiles", "NeedDaemonReload", "Environment")
        assert shown["DropInPaths"].split() == [DROP_IN, "/etc/systemd/system/sglang.service.d/operator.conf"]
        assert shown["NeedDaemonReload"] == "no" and shown["Environment"] == "SGLANG_OPERATOR=kept"
        assert shown["EnvironmentFiles"].splitlines() == [f"{ENV} (ignore_errors=no)"]  # once, from the drop-in
        info = served(host)
        assert info["env"]["SGLANG_NOTE"] == HOSTILE and info["env"]["SGLANG_OPERATOR"] == "kept"

        # Now an env change rewrites the env file alone: the unit and both drop-ins keep their bytes.
        unit_bytes, drop_in_bytes = unit_path.read_bytes(), drop_in.read_bytes()
        env2 = {**env, "SGLANG_NOTE": "second"}
        proc = apply(run_gpuops, host, "sglang-service", "-e", json.dumps({"sglang_env": env2}))
        report = report_of(proc)
        assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
        assert [c["path"] for c in report["changes"]] == [ENV]
        assert unit_path.read_bytes() == unit_bytes and drop_in.read_bytes() == drop_in_bytes
        assert served(host)["env"]["SGLANG_NOTE"] == "second"

        for _ in range(2):
            back = run_gpuops("rollback", "-i", str(host.inventory_path), env={"XDG_STATE_HOME": ""})
            assert back.returncode == 0, back.stdout + back.stderr
        assert files(host) == before and unit_path.read_bytes() == old_unit and not drop_in.exists()
        shown = host.systemctl_show("DropInPaths", "EnvironmentFiles", "NeedDaemonReload", "ActiveState")
        assert shown["DropInPaths"] == "/etc/systemd/system/sglang.service.d/operator.conf"
        assert shown["EnvironmentFiles"].splitlines() == [f"{ENV} (ignore_errors=no)"]  # from the old unit again
        assert shown["NeedDaemonReload"] == "no" and shown["ActiveState"] == "active"
        info = served(host)
        assert "SGLANG_NOTE" not in info["env"] and info["env"]["NCCL_DEBUG"] == "WARN"
    finally:
        operator.unlink(missing_ok=True)
        put_back_lab_files(host, lab_files)


@pytest.mark.parametrize("undo", ["rollback", "client_killed"])
def test_the_drop_in_directory_gpuops_created_is_gone_after_the_undo(host, run_gpuops, gpuops_home, undo: str) -> None:
    """A host set up before the drop-in, with no ``sglang.service.d`` at all: the env change creates
    the directory for gpuops' drop-in; `gpuops rollback`, and the host's own rollback after the client
    is killed (kill -9) mid-run, leave no empty directory behind (systemd lists no drop-in path)."""
    import signal

    from gpuops.lab.systemd_host import GROUP_VARS, render_service_files

    lab_files = render_service_files({**GROUP_VARS, **host.host_vars})
    unit_path, drop_in = host.booted.path(UNIT), host.booted.path(DROP_IN)
    old_unit = lab_files[UNIT].replace("ExecStart=", f"EnvironmentFile={ENV}\nExecStart=", 1).encode()
    unit_path.write_bytes(old_unit)
    drop_in.unlink()
    drop_in.parent.rmdir()  # the lab's drop-in was its only file
    try:
        assert host.booted.run(["systemctl", "daemon-reload"]).returncode == 0
        assert host.booted.run(["systemctl", "restart", host.unit]).returncode == 0
        served(host)
        before = files(host)
        env = {**original_env(host), "SGLANG_NOTE": "in a new drop-in"}
        if undo == "rollback":
            proc = apply(run_gpuops, host, "sglang-service", "-e", json.dumps({"sglang_env": env}))
            report = report_of(proc)
            assert proc.returncode == 0 and report["status"] == "finished", proc.stdout + proc.stderr
            assert drop_in.read_text() == lab_files[DROP_IN]
            back = run_gpuops("rollback", "-i", str(host.inventory_path), env={"XDG_STATE_HOME": ""})
            assert back.returncode == 0, back.stdout + back.stderr
        else:
            state = host.booted.path("/var/lib/gpuops")
            rolled_back_before = rolled_back_count(state)
            client = client_paused_at(state, "health", ["apply", "sglang-service", "-i", str(host.inventory_path),
                                                        "-e", "gpuops_lease=4", "-e", "gpuops_health_timeout=60",
                                                        "-e", json.dumps({"sglang_env": env})], gpuops_home, 120)
            try:
                assert drop_in.parent.is_dir()  # made by the run, which systemd now runs
                client.send_signal(signal.SIGKILL)
                client.wait(timeout=30)
            finally:
                if client.poll() is None:
                    client.kill()
            wait_for_self_rollback(state / "lock", lambda: rolled_back_count(state) > rolled_back_before,
                                   time.monotonic() + 4 + 60)
        assert files(host) == before and unit_path.read_bytes() == old_unit
        assert not drop_in.parent.exists()
        shown = host.systemctl_show("DropInPaths", "NeedDaemonReload", "ActiveState")
        assert (shown["DropInPaths"], shown["NeedDaemonReload"], shown["ActiveState"]) == ("", "no", "active")
        assert "SGLANG_NOTE" not in served(host)["env"]
    finally:
        put_back_lab_files(host, lab_files)


@pytest.mark.timeout(1500)  # a real venv + pip install of the lab wheelhouse inside the booted root, on a shared machine
def test_sglang_release_switches_the_unit_to_a_new_environment_and_back(systemd_host_factory, run_gpuops,
                                                                        tmp_path_factory) -> None:
    """sglang-release under real systemd: a build on a disk that fills up is refused with nothing
    changed; then the environment is built inside the booted root (whose Debian python3 has no
    ensurepip: the wheelhouse's pip wheel installs), the unit's ExecStart points at it and systemd
    restarts it; gpuops rollback puts the unit back byte for byte."""
    import ensurepip
    import shutil
    from pathlib import Path

    from gpuops.lab.hosts import STANDIN_SIBLINGS
    from gpuops.lab.systemd_host import STANDIN
    from gpuops.lab.wheelhouse import build_wheelhouse

    wheelhouse = build_wheelhouse(tmp_path_factory.mktemp("sd-wheelhouse"), ["0.5.21"])
    pip = sorted(Path(ensurepip.__file__).parent.glob("_bundled/pip-*.whl")) or sorted(
        Path("/usr/share/python-wheels").glob("pip-*-py3-none-any.whl"))
    assert pip, "no pip wheel on this machine to put in the wheelhouse"
    shutil.copy2(pip[-1], wheelhouse / pip[-1].name)
    # The new environment's python runs the lab's stand-in for `-m sglang.launch_server` (its
    # gpuops-lab-launch hook reads $GPUOPS_LAB_DIR/lib/standin_server.py).
    sd = systemd_host_factory(server_env={"GPUOPS_LAB_DIR": "/opt/gpuops-lab"})
    try:
        lib = sd.booted.path("/opt/gpuops-lab/lib")
        lib.mkdir(parents=True, exist_ok=True)
        for source in (STANDIN, *STANDIN_SIBLINGS):
            shutil.copyfile(source, lib / source.name)
        before, pid = files(sd), sd.systemctl_show("MainPID")["MainPID"]
        old_version = wait_server_info(sd.server_port, 60)["version"]

        # A disk that fills up during the build (a 48 MiB tmpfs: the wheelhouse fits, the installed
        # release does not; the free-space preflight is set to 0 so that the build really starts).
        small = sd.booted.run(["sh", "-c", "mkdir -p /opt/small && mount -t tmpfs -o size=48m tmpfs /opt/small"])
        assert small.returncode == 0, small.stderr
        full = run_gpuops("apply", "sglang-release", "-i", str(sd.inventory_path), "--json",
                          "-e", "sglang_version=0.5.21", "-e", f"sglang_wheelhouse={wheelhouse}",
                          "-e", "gpuops_envs_dir=/opt/small/envs", "-e", "gpuops_release_min_free_gib=0",
                          env={"XDG_STATE_HOME": ""}, timeout=1200)
        refused = json.loads(full.stdout)["hosts"]["sd1"]
        assert full.returncode == 1 and refused["status"] == "refused", full.stdout + full.stderr
        assert "No space left on device" in refused["error"], refused["error"]
        assert "refused before the server stopped, nothing was changed" in refused["error"]
        left = sd.booted.run(["sh", "-c", "ls -A /opt/small/envs"])  # inside: the tmpfs is the container's mount
        assert left.returncode == 0 and not [n for n in left.stdout.split() if n.startswith("sglang-")], left.stdout
        assert files(sd) == before and sd.systemctl_show("MainPID")["MainPID"] == pid

        proc = run_gpuops("apply", "sglang-release", "-i", str(sd.inventory_path), "--json",
                          "-e", "sglang_version=0.5.21", "-e", f"sglang_wheelhouse={wheelhouse}",
                          "-e", "gpuops_health_timeout=60", "-e", "gpuops_stop_grace=5",
                          env={"XDG_STATE_HOME": ""}, timeout=1200)
        report = json.loads(proc.stdout)["hosts"]["sd1"] if proc.stdout.strip().startswith("{") else {}
        assert proc.returncode == 0 and report.get("status") == "finished", proc.stdout + proc.stderr
        notes = "\n".join(report["notes"])
        assert "built with venv + pip from the wheelhouse" in notes, notes
        (env,) = sd.booted.path("/opt/gpuops/envs").glob("sglang-0.5.21-*")
        shown = sd.systemctl_show("ExecStart", "MainPID", "ActiveState")
        assert f"/opt/gpuops/envs/{env.name}/bin/python" in shown["ExecStart"], shown
        assert shown["ActiveState"] == "active" and shown["MainPID"] != pid
        assert wait_server_info(sd.server_port, 60)["version"] == "0.5.21"

        started = time.monotonic()
        back = run_gpuops("rollback", "-i", str(sd.inventory_path), "--json", env={"XDG_STATE_HOME": ""}, timeout=300)
        took = time.monotonic() - started
        assert back.returncode == 0, back.stdout + back.stderr
        print(f"\nsglang-release under systemd: rollback in {took:.1f} s", flush=True)
        assert files(sd) == before
        assert "/opt/gpuops/envs/" not in sd.systemctl_show("ExecStart")["ExecStart"]
        assert wait_server_info(sd.server_port, 60)["version"] == old_version
        assert env.is_dir()  # kept for a switch back
    finally:
        sd.stop()
