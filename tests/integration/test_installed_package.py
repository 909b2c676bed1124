"""Every install path works (issue 41): the wheel installed into a fresh venv, with ``pip install
--user`` into a fresh user base and with ``pipx install``, and an editable install of a checkout,
carry (or, editable, read) every file of src/gpuops, every role under roles/ (nested folders too),
every shared template and the docs the CLI points at, and find them through the package itself
(wherever the install scheme put it, never ``sys.prefix/share``). From a directory outside the
checkout, each install answers ``--help``, plans every role with ``--check`` on a lab host, starts
and stops a lab of its own (``lab up``: its stand-in server and GPU descriptions are package data),
and runs ``inspect``, ``advise``, ``bench`` and ``report`` against the shared lab host.

matplotlib is the documented ``[plot]`` extra, not a core dependency (only ``gpuops report`` draws):
the pipx install holds gpuops' core dependencies only, installed by pip from their wheels, and its
``report`` says in one line to ``pip install 'gpuops[plot]'``; the others see this interpreter's
packages, matplotlib included, and write the report.

Built once (``pip wheel --no-build-isolation`` of a copy of the build inputs, so no stale ``build/``
of the checkout leaks in). The venv, ``--user`` and editable installs take ``--no-deps --no-index``:
their runtime dependencies come from this interpreter's site-packages through a ``.pth`` line placed
after the install's own site-packages (and, for ``--user``, after the user site), so nothing is
downloaded and the installed gpuops is the one imported, which the test checks. The pipx install
is ``pipx install gpuops`` as from an index: pip finds the wheel in a folder (``PIP_FIND_LINKS``) and
resolves gpuops' core dependencies for real, offline, from a folder of their wheels (this
interpreter's versions, fetched once with ``pip download`` into ``$GPUOPS_CACHE/install-deps``, as
the lab fetches SGLang releases), and pipx's own pip from the wheel bundled with ``ensurepip``.

What is the same for every install is made once: the wheel (one build for the venv, ``--user`` and
pipx installs), pipx's shared pip (``PIPX_SHARED_LIBS``, kept in the user's cache like a user's own
pipx keeps it: ~6 CPU-s to make), and the gate scan of the lab host (one ``GPUOPS_KEEP`` for the
four installs, as one user's installs share theirs: the first install's ``apply fusion-sm120``
scans the host, ~7 CPU-s there; the others offer that scan and the host, running the fingerprint
check each install ships, answers that its tree is unchanged). Everything else each install does on
its own: its plans, its lab, its commands.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import ensurepip
import pytest
from gpuops.lab.file_lock import exclusive_lock
from gpuops.lab.sglang_cache import cache_root
from labtools import REPO_ROOT
from packaging.markers import Marker
from packaging.requirements import Requirement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

BUILD_INPUTS = ("pyproject.toml", "README.md", "src", "roles", "templates", "docs")
SHIPPED = ("roles", "templates", "docs")  # top-level folders the package carries as gpuops/data/<name>
INSTALLS = ("venv", "user", "pipx", "editable")
PLOT_MISSING = "gpuops: error: report: matplotlib is not installed (pip install 'gpuops[plot]')"
# What each role needs to plan on the lab host beyond the inventory (the TP group spans two sockets
# without P2P: the all-reduce roles refuse it unless told; sglang-release wants the release).
ROLE_VARS = {"fusion-sm120": ["-e", "fusion_allow_without_p2p=true"],
             "pcie-allreduce": ["-e", "pcie_allow_without_p2p=true"],
             "sglang-release": ["-e", "sglang_version=0.5.23"]}


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


def _run(args: list, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, args))}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _roles(checkout: Path) -> list[str]:
    return sorted(p.name for p in (checkout / "roles").iterdir() if p.is_dir() and not _skipped(p.name))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the build inputs: what the wheel is built from and what the editable install reads."""
    root = tmp_path_factory.mktemp("tree")
    for name in BUILD_INPUTS:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=lambda _, names: [n for n in names if _skipped(n)])
        else:
            shutil.copy2(source, root / name)
    return root


@pytest.fixture(scope="module")
def wheel(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built_from = tmp_path_factory.mktemp("tree-for-wheel") / "tree"
    shutil.copytree(tree, built_from)  # the build writes into its tree: never into the editable one
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", out, built_from])
    (built,) = out.glob("gpuops-*.whl")
    return built


def _core_pins() -> list[str]:
    """gpuops' core dependencies and theirs, at the versions this interpreter holds."""
    pins: dict[str, str] = {}
    todo = [Requirement(r) for r in importlib.metadata.requires("gpuops") or [] if "extra ==" not in r]
    while todo:
        requirement = todo.pop()
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name in pins or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        pins[name] = importlib.metadata.version(name)
        todo += [Requirement(r) for r in importlib.metadata.requires(name) or []
                 if ";" not in r or Marker(r.split(";", 1)[1]).evaluate({"extra": ""})]
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


@pytest.fixture(scope="module")
def dependency_wheels() -> Path:
    """A folder of the wheels of gpuops' core dependencies (downloaded once, cached)."""
    pins = _core_pins()
    folder = cache_root().parent / "install-deps" / hashlib.sha256(" ".join(pins).encode()).hexdigest()[:16]
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(folder.parent / ".lock"):
        if not folder.is_dir():
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                   "--disable-pip-version-check", "-d", str(partial), *pins],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.skip(f"pipx install: cannot fetch the wheels of gpuops' dependencies ({' '.join(pins)}): "
                            f"{done.stderr.strip().splitlines()[-1:]}")
            os.rename(partial, folder)
    return folder


@dataclass(frozen=True)
class Install:
    name: str
    python: Path      # the interpreter the gpuops script runs with
    script: Path      # bin/gpuops
    package: Path     # where `import gpuops` comes from
    data: Path        # where its roles/, templates/ and docs/ are
    env: dict[str, str]
    plots: bool       # matplotlib importable (the [plot] extra)


def _deps_line(python: Path) -> None:
    """This interpreter's site-packages after the install's own (its runtime dependencies)."""
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    deps = [p for p in dict.fromkeys(site.getsitepackages()) if Path(p).is_dir()]
    (Path(purelib) / "zz_gpuops_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))


def _venv(root: Path, system_site: bool) -> Path:
    """A fresh venv without pip (fast) whose own site-packages comes first, then this interpreter's."""
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []), root])
    python = root / "bin" / "python"
    _deps_line(python)
    return python


def _clean_env(root: Path, kept: Path) -> dict[str, str]:
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "VIRTUAL_ENV", "GPUOPS_ROLES_PATH",
            "SSH_AUTH_SOCK", "GPUOPS_LAB_DIR", "PIP_USER", "PIP_PREFIX", "PIP_TARGET", "PIP_REQUIRE_VIRTUALENV",
            "GPUOPS_INVENTORY", "XDG_STATE_HOME", "PIPX_HOME", "PIPX_BIN_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    home = root / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    env["HOME"] = str(home)
    # The releases and the lab's wheelhouses this machine has fetched (no download per install);
    # what gpuops keeps between runs, the one folder of this module's installs (``kept``).
    env["GPUOPS_CACHE"] = str(cache_root().parent)
    env["GPUOPS_KEEP"] = str(kept)
    return env


def _pip_install(python: Path, target: Path | str, env: dict[str, str], *extra: str) -> None:
    # The install's own interpreter runs pip (this interpreter's, seen through the .pth line), so the
    # scheme is its own (2.8 s here, 1.9 s with --no-compile: no bytecode for ~270 modules up front).
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile", "--no-build-isolation",
          "--no-warn-script-location", *extra, target], env=env)


def _where(python: Path, env: dict[str, str]) -> tuple[Path, Path]:
    probe = ("import gpuops, json; from pathlib import Path; from gpuops.role_paths import installed_data_dir; "
             "print(json.dumps([str(Path(gpuops.__file__).parent), str(installed_data_dir())]))")
    package, data = json.loads(_run([python, "-c", probe], env=env, cwd=env["HOME"]).stdout)
    return Path(package), Path(data)


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What gpuops keeps between commands (``GPUOPS_KEEP``), shared by the four installs: one
    user's installs of one gpuops share it. Kept plans and catalog values are keyed by the code and
    data dirs they were made with (``memo.code_digest``), so each install still plans on its own;
    the gate scan of the lab host is keyed by the host's tree, so it is made once."""
    return tmp_path_factory.mktemp("kept")


def _pipx_shared_libs() -> Path:
    """pipx's shared pip (a venv made from ``ensurepip``'s bundled wheels), kept in the user's cache
    per interpreter and bundled wheels, as a user's pipx keeps it in its home; pipx itself makes it
    and renews it when a month old (under ``exclusive_lock`` here: one pipx at a time uses it)."""
    base = getattr(sys, "_base_executable", sys.executable)
    bundled = sorted(p.name for p in (Path(ensurepip.__file__).parent / "_bundled").glob("*.whl"))
    key = hashlib.sha256(json.dumps([base, sys.version, bundled]).encode()).hexdigest()[:16]
    folder = cache_root().parent / "pipx-shared" / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module", params=INSTALLS)
def install(request: pytest.FixtureRequest, wheel: Path, tree: Path, kept: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp(request.param)
    env = _clean_env(root, kept)
    if request.param == "venv":
        python = _venv(root / "venv", system_site=False)
        _pip_install(python, wheel, env)
        script = root / "venv" / "bin" / "gpuops"
    elif request.param == "user":
        # --user needs a Python whose user site is on (a venv with system site packages is one);
        # the install goes to PYTHONUSERBASE, nowhere near sys.prefix.
        python = _venv(root / "uvenv", system_site=True)
        env["PYTHONUSERBASE"] = str(root / "userbase")
        _pip_install(python, wheel, env, "--user")
        script = root / "userbase" / "bin" / "gpuops"
    elif request.param == "editable":
        python = _venv(root / "evenv", system_site=False)
        _pip_install(python, tree, env, "-e")
        script = root / "evenv" / "bin" / "gpuops"
    else:
        if importlib.util.find_spec("pipx") is None:
            pytest.skip("pipx install: pipx is not installed for this interpreter (it is in the [test] extra: "
                        "pip install -e '.[test]')")
        wheels = request.getfixturevalue("dependency_wheels")
        bundled = Path(ensurepip.__file__).parent / "_bundled"  # pipx's shared pip, offline
        shared = _pipx_shared_libs()
        # `pipx install gpuops`, as from an index: the wheel's folder is one pip looks in (a wheel's
        # path would make pipx install it into a throwaway venv first, only to learn its name).
        env.update(PIPX_HOME=str(root / "pipx"), PIPX_BIN_DIR=str(root / "pipx-bin"), PIPX_MAN_DIR=str(root / "pipx-man"),
                   PIPX_SHARED_LIBS=str(shared), PIP_NO_INDEX="1", PIP_FIND_LINKS=f"{bundled} {wheels} {wheel.parent}")
        with exclusive_lock(shared.with_name(shared.name + ".lock")):
            _run([sys.executable, "-m", "pipx", "install", "gpuops"], env=env, timeout=900)
        python = root / "pipx" / "venvs" / "gpuops" / "bin" / "python"
        script = root / "pipx-bin" / "gpuops"
    assert script.is_file(), sorted(str(p.relative_to(root)) for p in root.rglob("gpuops"))
    package, data = _where(python, env)
    plots = subprocess.run([python, "-c", "import matplotlib"], env=env, capture_output=True).returncode == 0
    return Install(request.param, python, script, package, data, env, plots)


@pytest.fixture(scope="module")
def lab(lab_factory):
    # SGLang 0.5.23: every role plans here (pcie-allreduce and the fusion need a release that has them).
    return lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.23")


# What the installed gpuops finds, asked of the installed package itself from outside the checkout.
PROBE = """
import json
from gpuops.role_paths import default_roles_path, installed_data_dir, shared_templates_dirs
from gpuops.plan.roles import load_role_tree
names = sorted(p.name for p in (installed_data_dir() / "roles").iterdir() if p.is_dir())
print(json.dumps({
    "roles": names, "loaded": {name: sorted(load_role_tree(name)) for name in names},
    "search": [str(p) for p in default_roles_path()], "templates": [str(p) for p in shared_templates_dirs()],
}))
"""


def test_installed_package_finds_everything_from_outside_the_checkout(install: Install, tree: Path,
                                                                      tmp_path: Path) -> None:
    """The promise: each install answers ``--help`` through its own script and carries (editable:
    reads in place) every file of src/gpuops, roles/, templates/ and docs/, found through the
    package itself from outside the checkout (a file the wheel leaves out, a data dir looked up
    under ``sys.prefix/share``, a role tree that does not load: each fails here)."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run = dict(env=install.env, cwd=cwd)

    help_text = _run([install.script, "--help"], **run).stdout
    assert "apply" in help_text and "report" in help_text, help_text

    probe = json.loads(_run([install.python, "-c", PROBE], **run).stdout)
    if install.name == "editable":  # the checkout it was installed from, read in place
        assert (install.package, install.data) == (tree / "src" / "gpuops", tree), install
    else:  # the installed copy, not the checkout's, its data inside it
        assert REPO_ROOT not in install.package.parents and install.data == install.package / "data", install
        assert install.package.parent == Path(_run([install.python, "-c", "import site, sysconfig; print("
                                                    + ("site.getusersitepackages()" if install.name == "user"
                                                       else "sysconfig.get_path('purelib')") + ")"],
                                                   **run).stdout.strip()), install
    assert probe["roles"] == _roles(tree), probe
    assert all(name in deps for name, deps in probe["loaded"].items()), probe["loaded"]
    assert probe["search"] == [str(cwd / "roles"), str(install.data / "roles")], probe
    assert probe["templates"] == [str(cwd / "templates"), str(install.data / "templates")], probe

    # Every file of the checkout it was built from is there (a copy: others may be adding files to
    # the checkout meanwhile): the code and its data (remote modules, gate catalog, lab GPUs, bench/
    # and gates/ READMEs), and roles/, templates/, docs/ whole.
    assert _files(tree / "src" / "gpuops") - _files(install.package) == set()
    for name in SHIPPED:
        assert _files(tree / name) == _files(install.data / name), name


def test_every_command_of_the_quickstart_runs_from_outside_the_checkout(install: Install, tree: Path, lab,
                                                                         tmp_path: Path) -> None:
    """The promise: each install, through its own script from outside the checkout, plans every role
    on a lab host, starts and stops a lab of its own, and runs inspect, advise, bench and report
    (report: written where matplotlib is there, one line naming the [plot] extra where not)."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run = dict(env=install.env, cwd=cwd)
    inventory = str(lab.inventory_path)

    # Every role plans on the lab host: sglang-service renders the launch template from the installed
    # templates, sglang-release reads the release from the lab's wheelhouse, the all-reduce roles
    # judge the host (pcie-allreduce: the role the old data-files list forgot).
    for role in _roles(tree):
        proc = _run([install.script, "apply", role, "-i", inventory, "--check", "--diff", "--json",
                     *ROLE_VARS.get(role, [])], **run)
        (host,) = json.loads(proc.stdout)["hosts"].values()
        assert host["ok"] and host["status"] == "checked", (role, host)

    # A lab of its own: the stand-in server, the replaying nvidia-smi and the GPU descriptions are
    # package data.
    own = tmp_path / "own-lab"
    up = json.loads(_run([install.script, "lab", "up", "--dir", own, "--sglang", "0.5.8", "--json"], **run).stdout)
    try:
        assert [(h["sshd_alive"], h["server_healthy"]) for h in up["hosts"]] == [(True, True)], up
    finally:
        _run([install.script, "lab", "down", "--dir", own], **run)
    assert not own.exists()

    shown = _run([install.script, "inspect", "host", "-i", inventory], **run).stdout
    assert " pcie_ipc_allreduce: " in shown and "sglang 0.5.23" in shown, shown
    advice = _run([install.script, "advise", "-i", inventory], **run).stdout
    assert "$ gpuops apply pcie-allreduce -e pcie_allow_without_p2p=true" in advice, advice

    results = tmp_path / "results"
    bench = _run([install.script, "bench", "--remote", "-i", inventory, "--suite", "decode", "--results-dir", results,
                  "--num-requests", "2", "--warmup", "0", "--input-len", "16", "--output-len", "16", "--json"], **run)
    (measured,) = json.loads(bench.stdout)["hosts"].values()
    assert measured["ok"] and measured["output_tokens_per_s"] > 0, measured
    report = subprocess.run([str(install.script), "report", "--results-dir", str(results), "-o",
                             str(results / "report.html"), measured["result_id"]],
                            capture_output=True, text=True, timeout=300, **run)
    if install.plots:
        assert report.returncode == 0 and (results / "report.html").stat().st_size > 10_000, report.stderr
    else:  # the core install: one line naming the extra, nothing written
        assert report.returncode == 2 and report.stderr.strip() == PLOT_MISSING, (report.returncode, report.stderr)
        assert not (results / "report.html").exists()


def test_one_install_holds_core_dependencies_only(install: Install) -> None:
    """matplotlib comes with the [plot] extra only: the install that resolved gpuops' own
    dependencies (pipx) has none; each other install sees this interpreter's, which has it."""
    assert install.plots is (install.name != "pipx"), install
