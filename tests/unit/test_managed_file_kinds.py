"""A managed path that is not a regular UTF-8 text file is refused saying what it is: the real files
probe (apply/probes.py, run here through a local connection) and the planner's refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.errors import GpuopsError
from gpuops.gather import gather
from gpuops.inventory import Host
from gpuops.plan.model import PlanFacts
from gpuops.plan.planner import plan_role
from gpuops.transport.local import LocalConnection


def gathered(paths: list[str]) -> dict:
    from gpuops.apply.probes import files_probe

    host = Host(name="h01", address=None, port=None, user=None, key_file=None, groups=(), connection="local")
    return gather(LocalConnection(host), [files_probe(paths)])["apply.files"]


def plan_for(tmp_path: Path, dest: str, files: dict):
    role = tmp_path / "roles" / "r"
    (role / "templates").mkdir(parents=True)
    (role / "tasks.yml").write_text(f"- name: conf\n  template: {{src: conf.j2, dest: '{dest}'}}\n")
    (role / "templates" / "conf.j2").write_text("value=1\n")
    return plan_role("r", PlanFacts("h01", files), {}, {}, roles_path=[tmp_path / "roles"])


def test_a_symlink_is_refused_as_a_symlink_naming_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real.conf"
    real.write_text("value=0\n")
    link = tmp_path / "x.conf"
    link.symlink_to(real)
    files = gathered([str(link)])
    assert files["problems"] == {str(link): f"is a symbolic link to {real}"}
    with pytest.raises(GpuopsError) as refused:
        plan_for(tmp_path, str(link), files["files"])
    assert str(refused.value) == (f"h01: {link} is a symbolic link to {real}; "
                                  "gpuops manages regular UTF-8 text files")
    assert real.read_text() == "value=0\n"


@pytest.mark.parametrize("kind, why", [("directory", "is a directory"), ("binary", "is not UTF-8 text")])
def test_other_unmanageable_files_say_what_they_are(tmp_path: Path, kind: str, why: str) -> None:
    path = tmp_path / "x.conf"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe not utf-8\n")
    files = gathered([str(path)])
    with pytest.raises(GpuopsError, match=f"{path} {why}; gpuops manages regular UTF-8 text files"):
        plan_for(tmp_path, str(path), files["files"])


def test_a_regular_file_plans_as_before(tmp_path: Path) -> None:
    path = tmp_path / "x.conf"
    path.write_text("value=0\n")
    plan = plan_for(tmp_path, str(path), gathered([str(path)])["files"])
    assert [c.after for c in plan.changes] == ["value=1\n"]
