"""Every remote-shell value quoted: a managed file whose path holds blanks, quotes and shell syntax.

README/DESIGN: "every remote-shell value quoted". The hostile values of the server's environment and
flags are tested in test_apply.py; here the hostile value is a *path* gpuops reads (the apply's file
probe), writes (the helper), and hands to the launch script that sources it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration


def test_a_hostile_env_file_path_is_one_path_everywhere(lab_factory, run_gpuops, tmp_path: Path) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None)
    host = lab.hosts[0]
    before = tree_hashes(host.dir, skip_runs=True)
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    odd = host.state_dir / f"odd name; touch {marker.name} 'q' $(touch {marker.name}).env"
    extra = json.dumps({"sglang_env_file": str(odd), "sglang_env": {"SGLANG_PATH_MARK": "1"}})
    done = run_gpuops("apply", "sglang-service", "-i", str(lab.inventory_path), "--json", "-e", extra,
                      "-e", "gpuops_health_timeout=30", "-e", "gpuops_stop_grace=5", cwd=tmp_path,
                      env={"XDG_STATE_HOME": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["hosts"][host.name]["status"] == "finished"
    assert odd.is_file() and "SGLANG_PATH_MARK='1'" in odd.read_text()
    assert "SGLANG_PATH_MARK" in json.dumps(server_info(host.server_port))  # sourced from that one path
    assert not marker.exists() and not list(host.dir.rglob(marker.name))
    undone = run_gpuops("rollback", "-i", str(lab.inventory_path), cwd=tmp_path, env={"XDG_STATE_HOME": ""})
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert tree_hashes(host.dir, skip_runs=True) == before
