"""Where something installed on the host may step into an apply run (stdlib only, Python 3.8+).

gpuops ships no hooks: a run calls them only when a module named ``gpuops_host_hooks`` is
importable by the python the helper runs with (on its ``sys.path``, e.g. through ``PYTHONPATH``).
Anything that can put a module there can already run code in that python, so this adds no trust.
The lab installs one on its hosts to inject faults (``gpuops/lab/host_faults.py``); product code
never asks whether it runs in the lab.

A hooks module may define any of:

    at_phase(run, name)          at each named phase of a run (``Run.phase``, plus
                                 ``rollback_restore`` and ``rollback_health``); may wait, or raise to fail the run;
                                 also at ``committed`` (the journal says finished, the host has
                                 not answered gpuops yet): it may wait there, and whatever it
                                 raises is ignored, since nothing can undo a commit
    written_data(run, path, data)  the bytes about to be written for ``path`` (host files and the
                                   files of a derived image); returns the bytes to write
    audit_output(run, stdout)      the gate re-audit's stdout; returns what the run judges

``run`` is the helper's ``apply_run.Run`` (``state_dir``, ``progress``, ``lease``, ...).
"""

import importlib

MODULE = "gpuops_host_hooks"


class HostHooks:
    """The installed module's functions, or the identity where it has none (or there is no module)."""

    def __init__(self, module=None):
        self.module = module

    def _get(self, name):
        return getattr(self.module, name, None) if self.module is not None else None

    def at_phase(self, run, name):
        hook = self._get("at_phase")
        if hook is not None:
            hook(run, name)

    def at_committed(self, run):
        """``at_phase(run, "committed")``, which cannot fail a run already journaled finished."""
        try:
            self.at_phase(run, "committed")
        except Exception:
            pass

    def written_data(self, run, path, data):
        hook = self._get("written_data")
        return data if hook is None else hook(run, path, data)

    def audit_output(self, run, stdout):
        hook = self._get("audit_output")
        return stdout if hook is None else hook(run, stdout)


def load_hooks():
    """The host's hooks (importing ``gpuops_host_hooks`` once per process), or none."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        if getattr(exc, "name", None) != MODULE:
            raise  # the module is there but broken: say so, rather than run without it
        module = None
    return HostHooks(module)
