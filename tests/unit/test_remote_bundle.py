"""The host-code bundler: a helper split into modules still runs as one script, on a python that has
no gpuops installed, and host modules stay stdlib-only Python 3.8."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuops.remote as remote
from gpuops import shipping
from gpuops.shipping import PAYLOAD_SEPARATOR, python_command
from gpuops.shipping.bundle import BundleError, bundled_source, find_bundle

REMOTE_DIR = Path(remote.__file__).parent

# What the host's own GPU stack provides to the benchmark helpers (never installed by gpuops).
HOST_STACK = {"torch", "flashinfer", "sgl_kernel", "sglang"}  # sglang: its custom all-reduce, measured


def write(directory: Path, name: str, text: str) -> None:
    path = directory / f"{name.replace('.', '/')}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def run_helper(script: str, payload: dict, tmp_path: Path, bytecode_dir: Path | None = None
               ) -> subprocess.CompletedProcess:
    """Run ``script`` exactly as a host would (the runner of ``python_command`` reading stdin), from
    an empty directory and with no PYTHONPATH, so only the bundle can supply its modules."""
    stdin = script.encode() + PAYLOAD_SEPARATOR + json.dumps(payload).encode()
    command = python_command(sys.executable, bytecode_dir=str(bytecode_dir) if bytecode_dir else None)
    return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"}, timeout=60)


@pytest.fixture
def helper_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "remote"
    write(tree, "entry", '"""Entry docstring."""\nfrom __future__ import annotations\n\nimport json\n'
                         "from gpuops.remote import fileops\n\n"
                         "def main():\n"
                         "    from gpuops.remote.journal import record\n"
                         "    payload = json.loads(GPUOPS_PAYLOAD)\n"
                         "    print(json.dumps({'sum': fileops.add(payload['a'], payload['b']), 'rec': record('x'),\n"
                         "                      'file': fileops.__file__}))\n\n"
                         "if __name__ == '__main__':\n    main()\n")
    write(tree, "fileops", "from gpuops.remote import mathops\n\ndef add(a, b):\n    return mathops.plus(a, b)\n")
    write(tree, "mathops", "def plus(a, b):\n    return a + b\n")
    write(tree, "journal", "def record(event):\n    return {'event': event}\n")
    write(tree, "unused", "raise SystemExit('never bundled')\n")
    return tree


def test_bundle_finds_every_module_the_entry_needs_and_nothing_else(helper_tree):
    bundle = find_bundle("entry", helper_tree)
    assert sorted(bundle.modules) == ["gpuops.remote.fileops", "gpuops.remote.journal", "gpuops.remote.mathops"]


def test_bundled_helper_runs_where_gpuops_is_not_installed(helper_tree, tmp_path):
    done = run_helper(bundled_source("entry", helper_tree), {"a": 2, "b": 40}, tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert out == {"sum": 42, "rec": {"event": "x"}, "file": "<gpuops-bundle:gpuops.remote.fileops>"}


def test_unbundled_split_helper_fails_on_the_host_so_the_bundle_is_what_makes_it_run(helper_tree, tmp_path):
    done = run_helper((helper_tree / "entry.py").read_text(), {"a": 1, "b": 1}, tmp_path)
    # ModuleNotFoundError where no gpuops is installed; ImportError where the client's own is.
    assert done.returncode != 0
    assert b"ImportError" in done.stderr or b"ModuleNotFoundError" in done.stderr


def test_bundle_line_goes_after_docstring_and_future_import_keeping_later_lines_one_off(helper_tree):
    text = (helper_tree / "entry.py").read_text()
    script = bundled_source("entry", helper_tree)
    original, bundled = text.splitlines(), script.splitlines()
    assert bundled[:2] == original[:2]
    assert bundled[2].startswith("exec(compile(")
    assert bundled[3:] == original[2:]


def test_helper_that_imports_no_sibling_is_sent_unchanged(helper_tree):
    assert bundled_source("mathops", helper_tree) == (helper_tree / "mathops.py").read_text()


def test_host_module_importing_client_code_is_refused_with_the_file_and_line(helper_tree):
    write(helper_tree, "bad", "import os\nfrom gpuops.plan import planner\n")
    with pytest.raises(BundleError, match=r"bad\.py: imports gpuops\.plan.*line 2"):
        find_bundle("bad", helper_tree)


def test_relative_imports_are_refused(helper_tree):
    write(helper_tree, "rel", "from . import mathops\n")
    with pytest.raises(BundleError, match="relative import"):
        find_bundle("rel", helper_tree)


def test_bundled_helper_serves_its_own_modules_before_an_installed_gpuops(helper_tree, tmp_path):
    """A host that happens to have some gpuops installed still runs exactly the code sent."""
    fake = tmp_path / "site" / "gpuops" / "remote"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "mathops.py").write_text("def plus(a, b):\n    return 'stale'\n")
    stdin = bundled_source("entry", helper_tree).encode() + PAYLOAD_SEPARATOR + b'{"a": 1, "b": 2}'
    done = subprocess.run(["sh", "-c", python_command(sys.executable)], input=stdin, capture_output=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site")},
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["sum"] == 3


def _host_modules() -> list[Path]:
    # Every file of remote/, its __init__.py too: the client's side (the bundler, its kept scripts,
    # the runner) is gpuops/shipping/.
    return sorted(REMOTE_DIR.glob("*.py"))


# The torchrun workers travel in the bench payload and run as files under the host's torch, in
# processes of their own; nothing imports them.
TORCHRUN_WORKERS = {"allreduce_bench.py", "fusion_bench.py"}

# The one import of client code left in remote/ (remote/__init__.py's __getattr__, in a function, so
# that importing remote/ stays stdlib-only): apply/txn.py still imports missing_python from
# gpuops.remote. Goes when that import names gpuops.shipping.
CLIENT_IMPORTS_ALLOWED: set[tuple[str, str]] = set()  # (file, client module) tolerated for now: none


def test_remote_is_the_host_code_alone_and_imports_nothing_of_the_client() -> None:
    # AST read of every import in remote/ (at the top and inside functions): the standard library,
    # gpuops.remote, or (the benchmark workers) the host's GPU stack; never another gpuops module.
    found = []
    for path in _host_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else ["." * node.level + (node.module or "")] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                ok = (name == "gpuops.remote" or name.startswith("gpuops.remote.") or top == "__future__"
                      or (top in sys.stdlib_module_names and top != "gpuops")
                      or (top in HOST_STACK and path.name in TORCHRUN_WORKERS)
                      or (path.name, name) in CLIENT_IMPORTS_ALLOWED)
                if not ok:
                    found.append(f"{path.name}:{node.lineno} imports {name}")
    assert found == [], "remote/ is host code (stdlib only); move the client's side to gpuops/shipping/:\n" + "\n".join(found)


def test_every_host_module_imports_with_the_standard_library_alone(tmp_path: Path) -> None:
    # remote/ copied alone under an empty gpuops package, imported by an isolated python (-I -S: no
    # site-packages, no PYTHONPATH, no gpuops installed): a module that needs anything else fails.
    tree = tmp_path / "gpuops"
    tree.mkdir()
    (tree / "__init__.py").write_text("")
    names = []
    (tree / "remote").mkdir()
    for path in _host_modules():
        (tree / "remote" / path.name).write_text(path.read_text())
        if path.name not in TORCHRUN_WORKERS:
            names.append("gpuops.remote" if path.name == "__init__.py" else f"gpuops.remote.{path.stem}")
    assert len(names) > 50
    code = ("import importlib, sys\nsys.path.insert(0, sys.argv[1])\nbad = []\n"
            "for name in sys.argv[2:]:\n"
            "    try:\n        importlib.import_module(name)\n"
            "    except Exception as exc:\n        bad.append(f'{name}: {type(exc).__name__}: {exc}')\n"
            "print('\\n'.join(bad) or 'OK')\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tmp_path), *names], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.strip() == "OK", done.stdout + done.stderr


@pytest.mark.parametrize("path", _host_modules(), ids=lambda p: p.name)
def test_every_host_module_is_python38(path):
    # Its imports: test_remote_is_the_host_code_alone_and_imports_nothing_of_the_client.
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


@pytest.mark.parametrize("path", [p for p in _host_modules() if p.name != "__init__.py"], ids=lambda p: p.name)
def test_every_shipped_helper_bundles(path):
    """source() is what every caller ships: it must build for each helper."""
    text = shipping.source(path.stem)
    compile(text, path.name, "exec")


# ---------------------------------------------------------------- the kept scripts (bundle_cache.py)


@pytest.fixture(autouse=True)
def _keep_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))


def keep_bundles(tmp_path: Path) -> Path:
    """Where the memo layer keeps bundled scripts for this test (GPUOPS_KEEP set above)."""
    return tmp_path / "kept" / "bundles"


def test_a_kept_bundle_is_used_while_its_files_are_unchanged(helper_tree: Path, tmp_path: Path) -> None:
    from gpuops.shipping import bundle_cache

    cache_dir = keep_bundles(tmp_path)
    first = bundled_source("entry", helper_tree, cached=True)
    assert first == bundled_source("entry", helper_tree)
    (kept,) = cache_dir.glob("*.json")
    key = bundle_cache.bundle_key("entry", helper_tree)
    assert key is not None and bundle_cache.read(key) == first
    # What the kept file says is what is used (so the edits below must be seen to be missed).
    data = json.loads(kept.read_text())
    kept.write_text(json.dumps({**data, "script": "# kept"}))
    assert bundled_source("entry", helper_tree, cached=True) == "# kept"
    # ... until one of those files changes: then the fresh bundle, never the kept text.
    path = helper_tree / "mathops.py"
    path.write_text(path.read_text() + "\n")
    assert bundled_source("entry", helper_tree, cached=True) == bundled_source("entry", helper_tree)


@pytest.mark.parametrize("edited", ["entry", "fileops", "mathops", "journal"])
def test_editing_the_entry_or_any_bundled_module_bundles_again(helper_tree: Path, tmp_path: Path, edited: str) -> None:
    cache_dir = keep_bundles(tmp_path)
    before = bundled_source("entry", helper_tree, cached=True)
    assert len(list(cache_dir.glob("*.json"))) == 1  # kept: what follows must see the edit past it
    path = helper_tree / f"{edited}.py"
    path.write_text(path.read_text() + "\nEDITED = True\n")
    after = bundled_source("entry", helper_tree, cached=True)
    assert after != before and "EDITED = True" in after
    assert after == bundled_source("entry", helper_tree)


def test_a_module_newly_imported_is_bundled_at_once(helper_tree: Path, tmp_path: Path) -> None:
    cache_dir = keep_bundles(tmp_path)
    bundled_source("entry", helper_tree, cached=True)
    assert len(list(cache_dir.glob("*.json"))) == 1
    write(helper_tree, "mathops", "from gpuops.remote import extra\n\ndef plus(a, b):\n    return extra.add(a, b)\n")
    write(helper_tree, "extra", "def add(a, b):\n    return a + b + 1\n")
    script = bundled_source("entry", helper_tree, cached=True)
    assert "gpuops.remote.extra" in script
    done = run_helper(script, {"a": 2, "b": 40}, tmp_path)
    assert json.loads(done.stdout)["sum"] == 43, done.stderr


def test_torn_or_foreign_kept_files_are_bundled_again(helper_tree: Path, tmp_path: Path) -> None:
    from gpuops.shipping import bundle_cache

    cache_dir = keep_bundles(tmp_path)
    fresh = bundled_source("entry", helper_tree, cached=True)
    (kept,) = cache_dir.glob("*.json")
    key = bundle_cache.bundle_key("entry", helper_tree)
    assert key is not None
    whole = {"format": 1, "key": key.digest, "kind": "bundles"}
    for bad in ("{torn", json.dumps({**whole, "script": "# foreign"}), json.dumps({**whole, "files": {}, "script": "# foreign"}),
                json.dumps({**whole, "files": {str(tmp_path / "gone.py"): [1, 2]}, "script": "# foreign"}),
                json.dumps({**json.loads(kept.read_text()), "kind": "plans", "script": "# foreign"})):
        kept.write_text(bad)
        assert bundle_cache.read(key) is None
        assert bundled_source("entry", helper_tree, cached=True) == fresh


def test_source_reads_kept_helpers_without_the_bundler_and_bundles_on_a_miss(tmp_path: Path) -> None:
    # gpuops.shipping.source(): a kept helper costs no import of bundle.py; the script is the bundle.
    code = ("import sys\nfrom gpuops.shipping import source\nfrom gpuops.shipping.bundle import bundled_source\n"
            "from pathlib import Path\nimport gpuops.remote as r\n"
            "fresh = bundled_source('gate_scan', Path(r.__file__).parent)\n"
            "assert source('gate_scan') == fresh\n"  # kept now (or it was)
            "del sys.modules['gpuops.shipping.bundle']\n"
            "assert source('gate_scan') == fresh and 'gpuops.shipping.bundle' not in sys.modules\nprint('OK')\n")
    env = {**os.environ, "GPUOPS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "OK", done.stderr


# ------------------------------------------------- compiled modules kept on the host (bundle.py's bootstrap)


def sums(script: str, tmp_path: Path, kept: Path) -> int:
    done = run_helper(script, {"a": 2, "b": 40}, tmp_path, kept)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)["sum"]


def entry_defining(directory: Path, function: str) -> Path:
    """The kept entry of the module that defines ``function``."""
    import marshal

    def defines(path: Path) -> bool:
        code = marshal.loads(path.read_bytes()[32:])
        return any(getattr(const, "co_name", None) == function for const in code.co_consts)

    (entry,) = [p for p in directory.iterdir() if defines(p)]
    return entry


def replace_code(entry: Path, source: str, header: bytes | None = None) -> None:
    """Give a kept entry the code of ``source`` (under its own header, or ``header``)."""
    import marshal

    data = entry.read_bytes()
    entry.write_bytes((header or data[:32]) + marshal.dumps(compile(source, "<planted>", "exec")))


def state_dir(tmp_path: Path) -> Path:
    """A host's gpuops state dir (it exists: the helper keeps bytecode in it, never makes it)."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return state


def test_a_helper_keeps_its_compiled_modules_and_runs_them_the_next_time(helper_tree, tmp_path):
    kept = state_dir(tmp_path) / "bytecode"
    script = bundled_source("entry", helper_tree)
    assert sums(script, tmp_path, kept) == 42
    entries = sorted(kept.iterdir())
    assert len(entries) == 3 and kept.stat().st_mode & 0o777 == 0o700  # fileops, mathops, journal
    # What is kept is what runs: mathops' entry (the one that adds) made to multiply.
    replace_code(entry_defining(kept, "plus"), "def plus(a, b):\n    return a * b\n")
    assert sums(script, tmp_path, kept) == 80
    # An edited module is another entry: the edit runs, never the kept code of the old text.
    edited = script.replace("return a + b", "return a + b + 1")
    assert edited != script and sums(edited, tmp_path, kept) == 43
    assert len(list(kept.iterdir())) == 4


def test_a_kept_entry_that_names_another_digest_is_compiled_again(helper_tree, tmp_path):
    kept = state_dir(tmp_path) / "bytecode"
    script = bundled_source("entry", helper_tree)
    assert sums(script, tmp_path, kept) == 42
    mathops = entry_defining(kept, "plus")
    # Valid code under a header that is not this file's digest (a torn rename, another python's or
    # another text's entry put there): compiled from the source again, and the entry made right.
    replace_code(mathops, "def plus(a, b):\n    return a * b\n", header=bytes(32))
    assert sums(script, tmp_path, kept) == 42
    assert mathops.read_bytes()[:32] != bytes(32)
    for torn in (b"", mathops.read_bytes()[:40]):  # empty, and a header with half its code
        mathops.write_bytes(torn)
        assert sums(script, tmp_path, kept) == 42


def test_a_directory_others_may_write_or_a_link_is_never_used(helper_tree, tmp_path):
    script = bundled_source("entry", helper_tree)
    kept = state_dir(tmp_path) / "bytecode"
    assert sums(script, tmp_path, kept) == 42
    replace_code(entry_defining(kept, "plus"), "def plus(a, b):\n    return a * b\n")
    kept.chmod(0o777)  # another user could have put that there: not read
    assert sums(script, tmp_path, kept) == 42
    kept.chmod(0o700)
    kept.rename(tmp_path / "elsewhere")
    kept.symlink_to(tmp_path / "elsewhere")  # nor followed through a link
    assert sums(script, tmp_path, kept) == 42


def test_nothing_is_made_where_the_state_dir_is_missing_or_not_the_users(helper_tree, tmp_path):
    script = bundled_source("entry", helper_tree)
    missing = tmp_path / "no-state" / "bytecode"  # a command refused on a host gpuops never changed
    assert sums(script, tmp_path, missing) == 42
    assert not missing.parent.exists()
    if os.geteuid() == 0:  # a state dir of another user: nothing made in it
        other = tmp_path / "other-state"
        other.mkdir()
        os.chown(other, 65534, 65534)
        assert sums(script, tmp_path, other / "bytecode") == 42
        assert not (other / "bytecode").exists()


def test_nothing_is_kept_on_the_host_while_gpuops_keeps_nothing(helper_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    kept = state_dir(tmp_path) / "bytecode"
    assert "GPUOPS_BYTECODE=''" in python_command(sys.executable, bytecode_dir=str(kept))
    assert sums(bundled_source("entry", helper_tree), tmp_path, kept) == 42
    assert not kept.exists()


def test_only_the_transaction_helper_is_given_a_directory_in_the_state_dir() -> None:
    """Read-only commands keep nothing on the host: the gather (and the gate scanner in it) is never
    given a directory; apply's transaction helper keeps its modules in gpuops' state dir."""
    from gpuops.apply.remote_exec import _helper_command
    from gpuops.facts.python_select import preamble_for_vars

    assert "GPUOPS_BYTECODE" not in preamble_for_vars({})
    assert "GPUOPS_BYTECODE=/var/lib/gpuops/bytecode; export" in _helper_command({}, False, "/var/lib/gpuops/")
    assert "GPUOPS_BYTECODE=''; export" in _helper_command({}, False, None)
