"""The client's side of host code: a helper of ``gpuops/remote/`` bundled and shipped to a host.

Host code (``gpuops.remote``) is stdlib-only and runs on hosts with the host's own python (3.8+); it
is never installed there. This package runs on the client: ``source(name)`` is a helper's text with
the host modules it imports bundled in (``bundle.py``; the finished script kept by the memo layer,
``bundle_cache.py``), ``python_command()`` the command that runs a helper and ``python_stdin(name,
payload)`` the bytes to send it. The runner splits stdin at a separator line and runs the helper's
source as ``__main__`` with ``GPUOPS_PAYLOAD`` (the JSON payload, bytes) in its globals.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from gpuops import memo
from gpuops.shipping import bundle_cache

# The host modules' directory (gpuops/remote/), as importlib.resources.files() names it for a package
# on disk (the bundler stats and reads real files); not through importlib.resources, whose import
# costs ~5 ms.
HOST_CODE = Path(__file__).parent.parent / "remote"

PAYLOAD_SEPARATOR = b"\n#--gpuops-payload--\n"

# The one stderr line a helper's command prints when it has no python to run on (none on PATH, a
# gpuops_python that is not there, one older than 3.8), exit status 127, before anything ran on the
# host: the client names it (``missing_python``) instead of "connection lost, outcome unknown".
NO_PYTHON = "gpuops: no python: "
NO_PYTHON_STATUS = 127

# First in every runner, in syntax Python 2 still parses: an interpreter too old says so and stops.
_VERSION_CHECK = (
    "import sys;sys.version_info>=(3,8) or (sys.stderr.write('%s'+sys.executable+' is Python '+"
    "sys.version.split()[0]+'; gpuops needs 3.8+ (set gpuops_python to one)\\n'),sys.exit(%d));"
    % (NO_PYTHON, NO_PYTHON_STATUS)
)

_RUNNER = _VERSION_CHECK + (
    "d=sys.stdin.buffer.read();s,_,p=d.partition(%r);"
    "g={'__name__':'__main__','__file__':'<gpuops-helper>','GPUOPS_PAYLOAD':p};"
    "exec(compile(s,'<gpuops-helper>','exec'),g)" % PAYLOAD_SEPARATOR
)

# For a helper that keeps talking with gpuops after it starts (apply's transaction): stdin begins
# with the length of source + separator + payload, and what follows stays for the helper to read.
_STREAM_RUNNER = _VERSION_CHECK + (
    "b=sys.stdin.buffer;n=int(b.readline());d=b.read(n);s,_,p=d.partition(%r);"
    "g={'__name__':'__main__','__file__':'<gpuops-helper>','GPUOPS_PAYLOAD':p};"
    "exec(compile(s,'<gpuops-helper>','exec'),g)" % PAYLOAD_SEPARATOR
)


def source(name: str) -> str:
    """The text of the helper ``gpuops/remote/<name>.py``, with the host modules it imports bundled
    in (see ``bundle.py``), ready to run as one script."""
    key = bundle_cache.bundle_key(name, HOST_CODE)
    kept = bundle_cache.read(key) if key is not None else None  # without importing the bundler
    if kept is not None:
        return kept
    # Imported on a miss only: a command whose helpers are all kept never parses host code, nor
    # imports the bundler (tests/unit/test_remote_bundle.py holds it).
    from gpuops.shipping.bundle import bundled_source

    return bundled_source(name, HOST_CODE, cached=True)


# Helpers are stdlib-only, so their python starts without the site module (``-S``): no site-packages
# on sys.path, no ``.pth`` files run. Measured on this project's machine (load ~9), 50 starts each: Debian's
# /usr/bin/python3 -c pass 16.6 -> 10.6 ms CPU, a venv python with setuptools' and an editable
# install's .pth files 40 -> 14 ms; an apply starts several helpers a host.
_PYTHON_FLAGS = "-S"


# Where the host side of a bundled helper keeps its compiled modules (``bundle.py``), in its environment.
BYTECODE_ENV = "GPUOPS_BYTECODE"


def python_command(python: str | None = None, stream: bool = False, bytecode_dir: str | None = None) -> str:
    """The shell command that runs a helper shipped on stdin with the given (or the host's) python.

    ``stream``: the helper's stdin goes on after its payload (see ``python_stdin(stream=True)``).
    ``bytecode_dir``: a directory on the host, inside one that exists there, where the helper keeps
    its compiled modules (``bundle.py``); only while gpuops keeps results (``GPUOPS_KEEP=off``: none)."""
    keep = bytecode_dir if bytecode_dir and memo.root() is not None else ""
    setting = f"{BYTECODE_ENV}={shlex.quote(keep)}; export {BYTECODE_ENV}; "
    runner = shlex.quote(_STREAM_RUNNER if stream else _RUNNER)
    if python:
        # A named interpreter that is not there fails with a line that says which and why.
        missing = shlex.quote(f"{NO_PYTHON}gpuops_python {python} (or ansible_python_interpreter) is not an "
                              "executable on this host")
        return (f"{setting}"
                f"command -v {shlex.quote(python)} >/dev/null 2>&1 || {{ echo {missing} >&2; exit {NO_PYTHON_STATUS}; }}; "
                f"exec {shlex.quote(python)} {_PYTHON_FLAGS} -c {runner}")
    missing = shlex.quote(f"{NO_PYTHON}no python3 (nor python) on this host's PATH; set gpuops_python to a python 3.8+")
    return (
        f"{setting}"
        "p=$(command -v python3 || command -v python) || "
        f"{{ echo {missing} >&2; exit {NO_PYTHON_STATUS}; }}; "
        f'exec "$p" {_PYTHON_FLAGS} -c {runner}'
    )


def missing_python(stderr: str) -> str | None:
    """What a helper's command said when it found no python to run on (``NO_PYTHON``'s line, without
    its ``gpuops: ``), or None: nothing ran on the host then."""
    for line in stderr.splitlines():
        if NO_PYTHON in line:  # also quoted inside a probe's failure ("cannot parse output: ValueError: ...")
            return line[line.index(NO_PYTHON) + len("gpuops: "):].strip()[:500]
    return None


def python_stdin(name_or_source: str, payload: Any = None, *, is_source: bool = False, stream: bool = False) -> bytes:
    """stdin for ``python_command``: the helper's source, the separator, the JSON payload
    (``stream``: preceded by its length on a line of its own)."""
    text = name_or_source if is_source else source(name_or_source)
    body = text.encode("utf-8") + PAYLOAD_SEPARATOR + json.dumps(payload if payload is not None else {}).encode()
    return (b"%d\n" % len(body) + body) if stream else body

