"""The lab's fault injection, installed on every lab host's python path as ``gpuops_host_hooks``
(``remote/host_hooks.py`` says what a hooks module may define). Stdlib only, Python 3.8+: it runs
inside the apply helper on the host. Product code knows nothing of it.

A test puts a fault file at ``STATE/lab-fault.json``; the first hook call of a helper run reads it
once (renamed to ``lab-fault.used``):

    {"pause_at": PHASE, "seconds": S}   wait at PHASE (reports {"event": "paused"}; ends early if
                                        the lease lapses, except at rollback_restore)
        ..., "until": NAME}             ... or once the test made STATE/NAME (a release it controls)
    Phases besides the run's own (``Run.phase``): rollback_restore (a rollback's files are back,
    no server touched yet), rollback_health (the previous server started, before its health)
    {"fail_at": PHASE}                  fail the run at PHASE ("injected fault at PHASE")
    {"fail_at": PHASE, "times": N}      only the first N times the run passes PHASE (a rollback's
                                        own undo passes its phases again)
    {"corrupt_patch": true}             every .py file written (host files, image layers) gets a
                                        line that does not compile
    {"empty_audit": true}               the gate re-audit prints nothing

Honoured only on a lab host: the session has ``GPUOPS_LAB_HOST`` and the state dir lies in a lab
directory (a ``.gpuops-lab`` marker two levels above it). A run that never reaches a hook (a
rollback that only reports the runs standing on its target) leaves the file for the next call.
"""

import json
import os
import time
from gpuops.remote.apply_common import StepFailed

FAULT_FILE = "lab-fault.json"
USED_FILE = "lab-fault.used"
LAB_MARKER = ".gpuops-lab"
_BROKEN_LINE = b"\n)(  # gpuops lab fault: does not compile\n"

_faults = None  # read on the first hook call of this process


def faults_for(state_dir):
    """The fault file of ``state_dir``, once per process; {} anywhere but on a lab host."""
    global _faults
    if _faults is not None:
        return _faults
    _faults = {}
    if not os.environ.get("GPUOPS_LAB_HOST"):
        return _faults
    if not os.path.isfile(os.path.join(state_dir, os.pardir, os.pardir, LAB_MARKER)):
        return _faults
    path = os.path.join(state_dir, FAULT_FILE)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            found = json.load(handle)
        os.rename(path, os.path.join(state_dir, USED_FILE))
    except (OSError, ValueError):
        return _faults
    _faults = found if isinstance(found, dict) else {}
    return _faults


def at_phase(run, name):
    faults = faults_for(run.state_dir)
    if faults.get("pause_at") == name:
        run.progress({"event": "paused", "phase": name})
        until = time.monotonic() + float(faults.get("seconds", 5))
        released = os.path.join(run.state_dir, str(faults["until"])) if faults.get("until") else None
        while time.monotonic() < until and (name == "rollback_restore" or not run.lease.lapsed()) \
                and not (released and os.path.exists(released)):
            time.sleep(0.05)
    if faults.get("fail_at") == name:
        if "times" in faults:
            if int(faults["times"]) <= 0:
                return
            faults["times"] = int(faults["times"]) - 1

        raise StepFailed("injected fault at %s (lab fault file)" % name)


def written_data(run, path, data):
    if faults_for(run.state_dir).get("corrupt_patch") and path.endswith(".py"):
        return data + _BROKEN_LINE
    return data


def audit_output(run, stdout):
    return b"" if faults_for(run.state_dir).get("empty_audit") else stdout


def install(directory):
    """Put this module in ``directory`` (a lab host's python path) as ``gpuops_host_hooks``."""
    import shutil

    os.makedirs(str(directory), exist_ok=True)
    shutil.copyfile(os.path.abspath(__file__), os.path.join(str(directory), "gpuops_host_hooks.py"))
