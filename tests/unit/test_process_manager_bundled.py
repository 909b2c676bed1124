"""The process manager reaches the host as a bundled host module of the apply helper, never as
source text carried in the payload and exec'd there (issue 14)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import gpuops.remote as remote
from gpuops.shipping.bundle import find_bundle

REMOTE_DIR = Path(remote.__file__).parent


def test_the_apply_helper_bundle_carries_the_process_manager() -> None:
    assert "gpuops.remote.process_manager" in find_bundle("apply_helper", REMOTE_DIR).modules


def test_no_host_module_but_the_bundler_execs_source_text() -> None:
    # Only bundle.py's one bootstrap line may exec code; a helper that exec'd text from its payload
    # would run whatever the payload says, outside the bundle and its checks.
    offenders = []
    for path in sorted(REMOTE_DIR.glob("*.py")):
        if path.name == "bundle.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_a_run_drives_a_process_server_with_no_process_manager_in_its_payload(tmp_path: Path) -> None:
    from gpuops.remote.apply_lease import NoLease
    from gpuops.remote.apply_run import Run

    state = tmp_path / "state"
    state.mkdir()
    # A real process whose command line says it is a server (what the process manager checks):
    # python running a file at .../sglang/launch_server.py (here one that only sleeps).
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "launch_server.py").write_text("import time\ntime.sleep(60)\n")
    (state / "sglang-launch.sh").write_text(
        f"exec {sys.executable} {tmp_path / 'sglang' / 'launch_server.py'} --port 1\n")
    payload = {"state_dir": str(state), "run_id": "r1", "meta": {},
               "service": {"manager": "process", "state_dir": str(state), "port": 1, "grace": 5}}
    service = Run(payload, lambda event: None, NoLease()).service
    assert service.running() == (False, None)
    service.start()
    try:
        running, pid = service.running()
        assert running and isinstance(pid, int)
    finally:
        service.stop()
    assert service.running() == (False, None)
