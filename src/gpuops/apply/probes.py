"""What apply gathers, in the same single exec as any other probe: files, journal, the python.

The file probe sends contents back (base64, capped) so that diffs and idempotence are computed
locally; the sha256 it reports is what the helper later checks before it overwrites anything.
"""

from __future__ import annotations

import base64
import json
import shlex
from typing import Any

from gpuops.gather import LARGE_PROBE_OUTPUT_LIMIT, Probe, ProbeOutput
from gpuops.plan.entrypoint import LaunchEntry, parse_entry
from gpuops.plan.model import FileState
from gpuops.shipping import NO_PYTHON, NO_PYTHON_STATUS
from gpuops.remote.apply_journal import JOURNAL_FILE, journal_records
from gpuops.shipping import source

MAX_FILE_BYTES = 4 * 1024 * 1024

_FILES_CODE = r"""
import base64, hashlib, json, os, stat, sys
out = {"python": os.environ.get("GPUOPS_PY", ""), "files": {}}
for path in sys.argv[2:]:
    entry = {"exists": False}
    try:
        st = os.lstat(path)
    except OSError:
        out["files"][path] = entry
        continue
    entry["exists"] = True
    entry["mode"] = "%04o" % (st.st_mode & 0o7777)
    entry["uid"], entry["gid"] = st.st_uid, st.st_gid
    if stat.S_ISLNK(st.st_mode):
        try:
            entry["problem"] = "is a symbolic link to %s" % os.readlink(path)
        except OSError as exc:
            entry["problem"] = "is a symbolic link (%s)" % exc.strerror
    elif stat.S_ISDIR(st.st_mode):
        entry["problem"] = "is a directory"
    elif not stat.S_ISREG(st.st_mode):
        entry["problem"] = "is not a regular file (a device, socket or FIFO)"
    elif st.st_size > int(sys.argv[1]):
        entry["problem"] = "is larger than %s bytes" % sys.argv[1]
    else:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            entry["b64"] = base64.b64encode(data).decode()
        except OSError as exc:
            entry["problem"] = str(exc)
    out["files"][path] = entry
print(json.dumps(out))
"""


def _python_expr() -> str:
    # $GPUOPS_PY comes from the gather preamble; any python3 reads files as well.
    return '"${GPUOPS_PY:-python3}"'


# Neither: the one NO_PYTHON line with the preamble's reason (which names a gpuops_python that is not
# there), not "sh: python3: not found".
_NEEDS_PYTHON = ('[ -n "${GPUOPS_PY:-}" ] || command -v python3 >/dev/null 2>&1 || '
                 f'{{ echo "{NO_PYTHON}${{GPUOPS_PY_REASON:-no python3 on this host}}" >&2; exit {NO_PYTHON_STATUS}; }}\n')


def files_probe(paths: list[str] | tuple[str, ...]) -> Probe[dict[str, Any]]:
    words = " ".join(shlex.quote(p) for p in paths)
    # -S: the code is stdlib only, so the python starts without site (its .pth files and site-packages).
    script = f"{_NEEDS_PYTHON}{_python_expr()} -S -c {shlex.quote(_FILES_CODE)} {MAX_FILE_BYTES} {words}"
    # each file up to MAX_FILE_BYTES, base64 in JSON: the probe may say more than the default
    return Probe(name="apply.files", script=script, parse=parse_files, output_limit=LARGE_PROBE_OUTPUT_LIMIT)


def parse_files(output: ProbeOutput) -> dict[str, Any]:
    if output.exit_status != 0:
        raise ValueError(output.stderr.strip()[-300:] or f"exit status {output.exit_status}")
    raw = json.loads(output.stdout)
    files: dict[str, FileState] = {}
    problems: dict[str, str] = {}
    for path, entry in raw["files"].items():
        if not entry.get("exists"):
            files[path] = FileState(path=path, exists=False)
            continue
        content = None
        if "b64" in entry:
            try:
                content = base64.b64decode(entry["b64"]).decode("utf-8")
            except UnicodeDecodeError:
                problems[path] = "is not UTF-8 text"
        else:
            problems[path] = entry.get("problem") or "is unreadable"
        files[path] = FileState(
            path=path, exists=True, sha256=entry.get("sha256"), mode=entry.get("mode"),
            uid=entry.get("uid"), gid=entry.get("gid"), content=content, problem=problems.get(path),
        )
    return {"python": raw.get("python") or "", "files": files, "problems": problems}


def journal_probe(state_dir: str) -> Probe[list[dict[str, Any]]]:
    path = shlex.quote(state_dir.rstrip("/") + "/" + JOURNAL_FILE)
    # a journal grows with every run on the host
    return Probe(name="apply.journal", script=f"cat {path} 2>/dev/null; exit 0", parse=parse_journal,
                 output_limit=LARGE_PROBE_OUTPUT_LIMIT)


def parse_journal(output: ProbeOutput) -> list[dict[str, Any]]:
    # The host's own reader: client and host skip the same torn or foreign lines.
    return journal_records(output.stdout.splitlines())


def server_probe() -> Probe[bool]:
    """Does an SGLang server run on the host's port? The gather preamble has looked already
    (``facts/python_select.py``: a process whose argv launches SGLang with that ``--port``)."""
    return Probe(name="apply.server", script='printf "pid=%s\\n" "$GPUOPS_SERVER_PID"', parse=parse_server)


def parse_server(output: ProbeOutput) -> bool:
    line = output.stdout.strip()
    if output.exit_status != 0 or not line.startswith("pid="):
        raise ValueError(output.stderr.strip()[-300:] or f"unexpected answer {line[:80]!r}")
    return line[len("pid="):].isdigit()


def entrypoints_probe(pythons: tuple[str, ...], desired: str | None,
                      isolated: bool = False) -> Probe[dict[str, LaunchEntry]]:
    """For each python a launch may use (``pythons``, and those ``desired`` names: a release
    environment a standing run put in place), the entrypoint its release recommends, each asked
    under the PYTHONPATH its launch gives it (``remote/sglang_entrypoint.py``: ``isolated``, none, as
    for a release environment). A python that is not there answers nothing."""

    words = [*(["--desired", desired] if desired else []), *(["--isolated"] if isolated else []), *pythons]
    script = (f"GPUOPS_ENTRYPOINT_CODE={shlex.quote(source('sglang_entrypoint'))}; export GPUOPS_ENTRYPOINT_CODE\n"
              f'"${{GPUOPS_PY:-python3}}" -c "$GPUOPS_ENTRYPOINT_CODE" --drive {" ".join(shlex.quote(w) for w in words)} '
              "</dev/null 2>/dev/null; exit 0")
    return Probe(name="apply.entrypoints", script=script, parse=parse_entrypoints)


def parse_entrypoints(output: ProbeOutput) -> dict[str, LaunchEntry]:
    found: dict[str, LaunchEntry] = {}
    for line in output.stdout.splitlines():
        try:
            entry = parse_entry(json.loads(line))
        except ValueError:
            continue  # a python that printed something else (a wrapper's banner) is not read
        if entry is not None:
            found[entry.python] = entry
    return found
