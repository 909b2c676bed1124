"""The gpuops.gpu collection, installed with ansible-galaxy and run by ansible-playbook against a
real sshd lab host: its facts equal `gpuops inspect host --json`, its role action changes the host
as `gpuops apply` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
COLLECTION = Path(__file__).resolve().parents[2] / "ansible_collections" / "gpuops" / "gpu"
pytestmark = [pytestmark, pytest.mark.skipif(not (BIN / "ansible-playbook").exists(), reason="ansible-core not installed")]


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.8")


@pytest.fixture(scope="module")
def ansible(tmp_path_factory: pytest.TempPathFactory, lab):
    """ansible-galaxy installs the collection; an Ansible inventory of the lab host (strict host keys)."""
    root = tmp_path_factory.mktemp("ansible")
    env = {**os.environ, "ANSIBLE_HOME": str(root / "home"), "ANSIBLE_LOCAL_TEMP": str(root / "tmp"),
           "ANSIBLE_COLLECTIONS_PATH": str(root / "collections"), "ANSIBLE_CONFIG": str(root / "none.cfg"),
           "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_NOCOLOR": "1", "XDG_STATE_HOME": str(root / "state"),
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", str(COLLECTION), "-p", str(root / "collections")],
                   check=True, capture_output=True, env=env, timeout=300)
    data = yaml.safe_load(lab.inventory_path.read_text())
    hosts = data["all"]["children"]["lab"]["hosts"]
    for variables in hosts.values():
        variables["ansible_ssh_common_args"] = f"-o UserKnownHostsFile={lab.root / 'known_hosts'} -o StrictHostKeyChecking=yes"
        variables["ansible_python_interpreter"] = variables["gpuops_python"]
    (root / "inventory.yml").write_text(yaml.safe_dump(data))
    return root, env


def playbook(ansible, tasks: list[dict]) -> list[dict]:
    """Run the tasks on h01; each task's registered result, written home by a last task."""
    root, env = ansible
    out = root / "results.json"
    out.unlink(missing_ok=True)
    registered = [{**task, "register": f"r{i}"} for i, task in enumerate(tasks)]
    names = ", ".join(f"r{i}" for i in range(len(tasks)))
    registered.append({"ansible.builtin.copy": {"content": "{{ [" + names + "] | to_json }}", "dest": str(out)},
                       "delegate_to": "localhost", "check_mode": False})
    path = root / "play.yml"
    path.write_text(yaml.safe_dump([{"hosts": "h01", "gather_facts": False, "tasks": registered}]))
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(root / "inventory.yml"), str(path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def _results(results: list[dict]) -> list[dict]:
    return results


def test_facts_equal_gpuops_inspect_host(ansible, lab, run_gpuops) -> None:
    (result,) = _results(playbook(ansible, [{"gpuops.gpu.facts": {}}]))
    ours = json.loads(run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "--json").stdout)["hosts"]["h01"]
    theirs = result["gpuops"]
    assert theirs["ok"] and theirs["facts"]["gpus"] and theirs["facts"]["sm"] == "sm120"
    assert theirs["features"].keys() == ours["features"].keys()
    for document in (theirs, ours):  # other SGLang servers on this shared machine come and go between the runs
        document["facts"]["server"].pop("others", None)
    for key in ("facts", "gates", "features", "managed_launch"):
        assert json.dumps(theirs[key], sort_keys=True) == json.dumps(ours[key], sort_keys=True), key


def test_role_changes_the_host_and_check_mode_does_not(ansible, lab) -> None:
    host = lab.host("h01")
    env_file = host.state_dir / "sglang.env"
    check, = _results(playbook(ansible, [{"gpuops.gpu.role": {"name": "nccl-env", "vars": {"nccl_env": {"NCCL_MIN_NCHANNELS": 6}}},
                                           "check_mode": True}]))
    assert check["gpuops"]["status"] == "checked" and check["changed"]
    assert "NCCL_MIN_NCHANNELS" not in env_file.read_text()
    applied, again = _results(playbook(ansible, [{"gpuops.gpu.role": {"name": "nccl-env", "vars": {"nccl_env": {"NCCL_MIN_NCHANNELS": 6}}}}] * 2))
    assert applied["gpuops"]["status"] == "finished" and applied["changed"]
    assert "NCCL_MIN_NCHANNELS='6'" in env_file.read_text()
    assert again["gpuops"]["status"] == "unchanged" and not again["changed"]
