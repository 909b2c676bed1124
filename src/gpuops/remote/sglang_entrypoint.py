"""Runs ON THE HOST with the python that launches SGLang: which entrypoint its release recommends.

SGLang's releases carry two: ``python -m sglang.launch_server`` and the ``sglang`` console script
(``sglang = sglang.cli.main:main``) with its ``serve`` subcommand. From 0.5.16 on, launch_server's
``__main__`` warns "'python -m sglang.launch_server' is still supported, but 'sglang serve' is the
recommended entrypoint"; 0.5.8 has ``sglang serve`` and no such warning. So the release's own files
decide, read as text (never imported: an import of sglang takes seconds and may fail):

  * ``sglang/launch_server.py``: its ``if __name__ == "__main__":`` block warns that
    ``sglang serve`` is recommended;
  * ``sglang/cli/main.py``: it adds a ``serve`` subcommand (``add_parser("serve", ...)``);
  * its ``sglang-*.dist-info`` declares the ``sglang`` console script and its RECORD lists the script the
    installer wrote (a venv's ``bin/sglang``, ``--user``'s ``~/.local/bin/sglang``): the path the
    launch runs, with this python (``PYTHON SCRIPT serve FLAGS``, as the script's own shebang would).

All three: ``serve``; anything else (an older release, an install without the script, as by
``pip --target`` or a bare ``PYTHONPATH``): ``launch_server``, with why. Prints one JSON object
(``PYTHON`` as its only argument: the name the launch gives it). With ``--drive``, run by any python
(the gather's), it asks every python a launch may run, each under the PYTHONPATH that launch gives
(``drive``), its own source passed in ``$GPUOPS_ENTRYPOINT_CODE``.
Stdlib only, Python 3.8+; bundled with ``scan_read`` (bounded reads of regular files only).
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys

from gpuops.remote.scan_read import NotRead, read_regular

SOURCE_LIMIT = 1 << 20  # launch_server.py and cli/main.py are a few KiB in every release
RECORD_LIMIT = 16 << 20  # a RECORD lists every file: 0.5.23's ~5,000 lines, under 1 MiB
SERVE, LAUNCH_SERVER = "serve", "launch_server"


def _parsed(path):
    try:
        return ast.parse(read_regular(path, SOURCE_LIMIT).decode("utf-8", "replace"))
    except (NotRead, SyntaxError, ValueError):
        return None


def _is_main_guard(node):
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and _text(test.comparators[0]) == "__main__")


def _text(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string, from Python 3.8 on
        return node.value
    return None


def recommends_serve(tree):
    """launch_server.py's ``__main__`` block warns that ``sglang serve`` is the recommended entrypoint."""
    for block in (n for n in ast.walk(tree) if _is_main_guard(n)):
        for call in (n for stmt in block.body for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            message = _text(call.args[0]) if name == "warn" and call.args else None
            if message and "sglang serve" in message and "recommended" in message:
                return True
    return False


def has_serve_command(tree):
    """cli/main.py adds the ``serve`` subcommand."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_parser"
               and n.args and _text(n.args[0]) == SERVE for n in ast.walk(tree))


def console_script(package_dir):
    """The ``sglang`` script the installer wrote for this release, or why not: the package's own
    ``sglang-*.dist-info`` beside it declares the console script (entry_points.txt) and lists the
    script (RECORD, paths relative to the site dir). Read as text, not through importlib.metadata,
    whose import and RECORD parsing cost a launch python ~0.3 s on every apply's gather."""
    site = os.path.dirname(package_dir)
    infos = [name for name in os.listdir(site) if name.startswith("sglang-") and name.endswith(".dist-info")]
    if len(infos) != 1:
        return None, "no single sglang-*.dist-info beside the package (%d)" % len(infos)
    info = os.path.join(site, infos[0])
    try:
        entry_points = read_regular(os.path.join(info, "entry_points.txt"), SOURCE_LIMIT).decode("utf-8", "replace")
        record = read_regular(os.path.join(info, "RECORD"), RECORD_LIMIT).decode("utf-8", "replace")
    except NotRead as exc:
        return None, "the release's metadata cannot be read (%s)" % exc
    if not _declares_script(entry_points):
        return None, "the release declares no `sglang` console script"
    for line in record.splitlines():
        path = line.split(",", 1)[0]
        parts = path.replace("\\", "/").split("/")
        if len(parts) >= 2 and parts[-1] == "sglang" and parts[-2] in ("bin", "Scripts"):
            script = os.path.normpath(os.path.join(site, path))
            if os.path.isfile(script) and os.access(script, os.X_OK):
                return script, None
    return None, "the installer wrote no `sglang` script (an install without scripts: pip --target, PYTHONPATH)"


def _declares_script(entry_points):
    """entry_points.txt's [console_scripts] holds ``sglang = sglang.cli.main:...``."""
    section = None
    for line in entry_points.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == "console_scripts" and "=" in line:
            name, _, value = line.partition("=")
            if name.strip() == "sglang" and value.strip().startswith("sglang.cli.main:"):
                return True
    return False


def decide():
    spec = importlib.util.find_spec("sglang")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return {"entrypoint": LAUNCH_SERVER, "script": None, "why": "sglang is not installed for this python"}
    package_dir = list(spec.submodule_search_locations)[0]
    launch = _parsed(os.path.join(package_dir, "launch_server.py"))
    if launch is None or not recommends_serve(launch):
        return {"entrypoint": LAUNCH_SERVER, "script": None,
                "why": "the release's launch_server does not recommend `sglang serve`"}
    main = _parsed(os.path.join(package_dir, "cli", "main.py"))
    if main is None or not has_serve_command(main):
        return {"entrypoint": LAUNCH_SERVER, "script": None, "why": "the release's sglang CLI has no serve command"}
    script, why = console_script(package_dir)
    if script is None:
        return {"entrypoint": LAUNCH_SERVER, "script": None, "why": why}
    return {"entrypoint": SERVE, "script": script, "why": "the release recommends `sglang serve`"}


DESIRED_LIMIT = 1 << 20  # desired.json: one small record per gpuops run in effect
ASK_TIMEOUT_S = 60       # a python that reads two files and a RECORD; a hung one is not read
ANSWER_LIMIT = 64 * 1024


def pythons_of(desired):
    """(python, PYTHONPATH) of each gpuops run still in effect that names the python the launch runs
    (sglang-release's ``python`` in ``gpuops_state_dir/desired.json``, plan/compose.py), the
    PYTHONPATH being what that run's part of the launch environment sets (None: it sets none)."""
    try:
        data = json.loads(read_regular(desired, DESIRED_LIMIT).decode("utf-8", "replace"))
    except (NotRead, ValueError):
        return []
    runs = data.get("contributions") if isinstance(data, dict) else None
    found = []
    for contribution in (runs.values() if isinstance(runs, dict) else ()):
        python = contribution.get("python") if isinstance(contribution, dict) else None
        env = contribution.get("env") if isinstance(contribution, dict) else None
        path = env.get("PYTHONPATH") if isinstance(env, dict) else None
        if isinstance(python, str) and python.startswith("/") and "\n" not in python:
            found.append((python, path if isinstance(path, str) else None))
    return found


def ask(python, pythonpath, code):
    """``python``'s answer (this module run by it, under the launch's PYTHONPATH), or None."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath  # empty: none at all, as the launch gives it
    try:
        done = subprocess.run([python, "-c", code, python], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, timeout=ASK_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None  # not there (a release environment not built yet), or hung: not read
    lines = done.stdout[-ANSWER_LIMIT:].decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def drive(argv, code):
    """``--drive [--desired PATH] [--isolated] PYTHON...``: the answer of each python a launch may
    run, one JSON line each. The listed ones run under this process's PYTHONPATH (the gather's: the
    server's own, or sglang_env's), or none with ``--isolated`` (a release environment: its launch
    sets PYTHONPATH empty, plan/release.py); those desired.json names under their run's own."""
    desired, isolated, listed = None, False, []
    words = list(argv)
    while words:
        word = words.pop(0)
        if word == "--desired" and words:
            desired = words.pop(0)
        elif word == "--isolated":
            isolated = True
        else:
            listed.append(word)
    asked = [(python, "" if isolated else None) for python in listed]
    asked += pythons_of(desired) if desired else []
    seen = set()
    for python, pythonpath in asked:
        if python in seen:
            continue
        seen.add(python)
        # The python this driver already is, under the same PYTHONPATH (the gather's python is most
        # often the server's own): it would find the same sglang, so it answers here, without a
        # second interpreter start (~15 ms of CPU with site-packages on this project's machine, more
        # for a large environment on a real host).
        same = python == sys.executable and pythonpath is None and not _flags_change_sys_path()
        answer = answer_here() if same else ask(python, pythonpath, code)
        if answer is not None:
            answer["python"] = python
            print(json.dumps(answer))


def _flags_change_sys_path():
    """Was this python started with a flag that ``ask``'s plain ``python -c`` does not give (-S, -s,
    -E, -I)? Then its sys.path may differ from the one a launch gets."""
    flags = sys.flags
    return bool(flags.no_site or flags.no_user_site or flags.ignore_environment or flags.isolated)


def answer_here():
    """This python's answer: ``decide`` for the sglang its sys.path finds."""
    try:
        return decide()
    except Exception as exc:  # a broken install is an answer (launch_server, why), never a crash
        return {"entrypoint": LAUNCH_SERVER, "script": None, "why": "%s: %s" % (type(exc).__name__, exc)}


def main():
    if sys.argv[1:2] == ["--drive"]:
        drive(sys.argv[2:], os.environ.get("GPUOPS_ENTRYPOINT_CODE", ""))
        return
    answer = answer_here()
    answer["python"] = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
