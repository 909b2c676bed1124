"""Every install path works (issue 41): the wheel, installed into a fresh venv and with ``pip install
--user`` into a fresh user base, carries every file of src/gpuops, every role under roles/ (nested
folders too), every shared template and the docs the CLI points at, and finds them through the
package itself (wherever the install scheme put it, never ``sys.prefix/share``). From a directory
outside the checkout, each install answers ``--help``, loads every role the checkout has, and plans
``apply sglang-service --check --diff`` (which renders the launch template) and ``apply
pcie-allreduce --check`` on a lab host.

Built once (``pip wheel --no-build-isolation`` of a copy of the build inputs, so no stale ``build/``
of the checkout leaks in) and installed with ``--no-deps --no-index``: the runtime dependencies come
from this interpreter's site-packages through a ``.pth`` line placed after the install's own
site-packages (and, for ``--user``, after the user site), so nothing is downloaded and the
installed gpuops is the one imported, which the test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from labtools import REPO_ROOT

pytestmark = pytest.mark.integration

BUILD_INPUTS = ("pyproject.toml", "README.md", "src", "roles", "templates", "docs")
SHIPPED = ("roles", "templates", "docs")  # top-level folders the package carries as gpuops/data/<name>


def _skipped(name: str) -> bool:
    return name == "__pycache__" or name.endswith((".pyc", ".egg-info")) or name.startswith(".")


def _files(root: Path) -> set[str]:
    """Every file under root (relative, POSIX), bytecode, egg-info and dotfiles left out."""
    found = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and not any(_skipped(part) for part in rel.parts):
            found.add(rel.as_posix())
    return found


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, args))}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    for name in BUILD_INPUTS:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=lambda _, names: [n for n in names if _skipped(n)])
        else:
            shutil.copy2(source, tree / name)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", out, tree])
    (built,) = out.glob("gpuops-*.whl")
    return built


@dataclass(frozen=True)
class Install:
    name: str
    python: Path      # the interpreter the gpuops script runs with
    script: Path      # bin/gpuops
    site_dir: Path    # where the package went
    env: dict[str, str]


def _venv(root: Path, system_site: bool) -> Path:
    """A fresh venv without pip (fast) whose own site-packages comes first, then this interpreter's."""
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []), root])
    python = root / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    deps = [p for p in dict.fromkeys(site.getsitepackages()) if Path(p).is_dir()]
    (Path(purelib) / "zz_gpuops_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    return python


def _clean_env(home: Path) -> dict[str, str]:
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "VIRTUAL_ENV", "GPUOPS_ROLES_PATH",
            "SSH_AUTH_SOCK", "GPUOPS_LAB_DIR", "PIP_USER", "PIP_PREFIX", "PIP_TARGET", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["HOME"] = str(home)
    return env


def _pip_install(python: Path, wheel: Path, env: dict[str, str], *extra: str) -> None:
    # The install's own interpreter runs pip (this interpreter's, seen through the .pth line), so the
    # scheme is its own (2.8 s here, 1.9 s with --no-compile: no bytecode for ~270 modules up front).
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
          "--no-warn-script-location", *extra, wheel], env=env)


@pytest.fixture(scope="module", params=["venv", "user"])
def install(request: pytest.FixtureRequest, wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp(request.param)
    home = root / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    env = _clean_env(home)
    if request.param == "venv":
        python = _venv(root / "venv", system_site=False)
        _pip_install(python, wheel, env)
        script = root / "venv" / "bin" / "gpuops"
    else:
        # --user needs a Python whose user site is on (a venv with system site packages is one);
        # the install goes to PYTHONUSERBASE, nowhere near sys.prefix.
        python = _venv(root / "uvenv", system_site=True)
        env["PYTHONUSERBASE"] = str(root / "userbase")
        _pip_install(python, wheel, env, "--user")
        script = root / "userbase" / "bin" / "gpuops"
    assert script.is_file(), sorted(str(p.relative_to(root)) for p in root.rglob("gpuops"))
    where = "site.getusersitepackages()" if request.param == "user" else "sysconfig.get_path('purelib')"
    site_dir = Path(_run([python, "-c", f"import site, sysconfig; print({where})"], env=env).stdout.strip())
    return Install(request.param, python, script, site_dir, env)


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang=None)


# What the installed gpuops finds, asked of the installed package itself from outside the checkout.
PROBE = """
import json, gpuops
from pathlib import Path
from gpuops.plan.role_paths import default_roles_path, installed_data_dir, shared_templates_dirs
from gpuops.plan.roles import load_role_tree
data = installed_data_dir()
names = sorted(p.name for p in (data / "roles").iterdir() if p.is_dir())
print(json.dumps({
    "package": str(Path(gpuops.__file__).parent), "data": str(data), "roles": names,
    "loaded": {name: sorted(load_role_tree(name)) for name in names},
    "search": [str(p) for p in default_roles_path()], "templates": [str(p) for p in shared_templates_dirs()],
}))
"""


def test_installed_package_finds_everything_from_outside_the_checkout(install: Install, lab, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run = dict(env=install.env, cwd=cwd)

    help_text = _run([install.script, "--help"], **run).stdout
    assert "apply" in help_text and "report" in help_text, help_text

    probe = json.loads(_run([install.python, "-c", PROBE], **run).stdout)
    package = Path(probe["package"])
    assert package == install.site_dir / "gpuops", probe         # the installed copy, not the checkout's
    assert Path(probe["data"]) == package / "data", probe
    checkout_roles = sorted(p.name for p in (REPO_ROOT / "roles").iterdir() if p.is_dir() and not _skipped(p.name))
    assert probe["roles"] == checkout_roles, probe
    assert all(name in deps for name, deps in probe["loaded"].items()), probe["loaded"]
    assert probe["search"] == [str(cwd / "roles"), str(package / "data" / "roles")], probe
    assert probe["templates"] == [str(cwd / "templates"), str(package / "data" / "templates")], probe

    # Every file the checkout has is installed: the code and its data (remote modules, gate catalog,
    # lab GPUs, bench/ and gates/ READMEs), and roles/, templates/, docs/ whole.
    installed = _files(package)
    assert _files(REPO_ROOT / "src" / "gpuops") - installed == set()
    for name in SHIPPED:
        assert _files(REPO_ROOT / name) == _files(package / "data" / name), name

    # The CLI plans roles on a host: sglang-service renders the launch template (process manager)
    # from the installed templates; pcie-allreduce, the role the old data-files list forgot, is found.
    inventory = str(lab.inventory_path)
    service = _run([install.script, "apply", "sglang-service", "-i", inventory, "--check", "--diff",
                    "-e", '{"sglang_extra_args": ["--enable-metrics"]}', "--json"], **run)
    (host,) = json.loads(service.stdout)["hosts"].values()
    assert host["ok"] and host["status"] == "checked", host
    launch = [c for c in host["changes"] if c["kind"] == "template" and c["path"].endswith("/sglang-launch.sh")]
    assert launch and "--enable-metrics" in json.dumps(launch), host["changes"]
    pcie = _run([install.script, "apply", "pcie-allreduce", "-i", inventory, "--check", "--json"], **run)
    (host,) = json.loads(pcie.stdout)["hosts"].values()
    assert host["ok"] and host["status"] == "checked" and host["tasks_ok"] >= 1, host
