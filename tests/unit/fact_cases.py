"""The recorded outputs of every fact probe: ``tests/facts/<probe>/<case>.json`` (pyinfra's layout).

A case is one run of the probe's command and the value its parser must give:

    {"about": "what this case is",
     "stdout": "..."                        the command's output, inline; or
     "stdout_file": "src/gpuops/lab/gpus/h200-x1/topo.txt"   a file of the repository (the lab's
                                            captured replay files are used here as they are), or
                                            "fixtures:real/h200-x2/topo.txt" (tests/fixtures); or
     "replay": "h200-x1"                    the lab's fake nvidia-smi answering the probe's own
                                            arguments for that GPU description (what a lab host prints)
     "stderr": "", "exit_status": 0,        (defaults)
     "expected": {...}}                     the parsed value: a dataclass as ``asdict``, through JSON

The probes and their parsers come from the fact modules themselves (``PROBES`` below is every probe
of ``facts.host.probes_for``, with the nvidia-smi arguments of ``SMI_ARGS``), so a new probe only
needs its folder of cases (a test fails while it has none). Cases named ``lab-*`` were recorded
through a real gather over SSH from lab hosts (``gpuops lab up``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

from labtools import REPO_ROOT, fixtures_path

from gpuops.facts import gpu, topology
from gpuops.facts.host import probes_for
from gpuops.gather import ProbeOutput
from gpuops.inventory import Host

CASES_DIR = REPO_ROOT / "tests" / "facts"


@dataclasses.dataclass(frozen=True)
class FactProbe:
    name: str
    parse: Callable[[ProbeOutput], Any]
    smi_args: tuple[str, ...] | None  # the nvidia-smi arguments, for "replay" cases


def _registry() -> dict[str, FactProbe]:
    """Every probe ``inspect`` gathers for a host (facts/host.py's ``probes_for``)."""
    host = Host(name="case", address=None, port=None, user=None, key_file=None, connection="ssh", groups=(), vars={})
    smi_args = {**gpu.SMI_ARGS, **topology.SMI_ARGS}
    return {p.name: FactProbe(p.name, p.parse, smi_args.get(p.name)) for p in probes_for(host)}


PROBES = _registry()


def case_paths() -> list[Path]:
    return sorted(CASES_DIR.glob("*/*.json"))


def _read(path: Path) -> str:
    # newline="" keeps the bytes exactly as captured (tabs, ANSI escapes, line ends).
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def case_output(case: dict[str, Any], probe: FactProbe) -> ProbeOutput:
    """The probe's output in a case, from whichever source the case names."""
    sources = [key for key in ("stdout", "stdout_file", "replay") if key in case]
    assert len(sources) == 1, f"a case has exactly one of stdout, stdout_file, replay (has {sources})"
    status = case.get("exit_status", 0)
    if "stdout" in case:
        stdout = case["stdout"]
    elif "stdout_file" in case:
        ref = case["stdout_file"]
        stdout = _read(fixtures_path() / ref[len("fixtures:"):] if ref.startswith("fixtures:") else REPO_ROOT / ref)
    else:
        from gpuops.lab.fake_nvidia_smi import run
        from gpuops.lab.gpu_description import load_description

        assert probe.smi_args is not None, f"{probe.name} is not an nvidia-smi probe: it cannot be replayed"
        desc = load_description(case["replay"])
        status, stdout = run(list(probe.smi_args), desc.replay, now=0)
    return ProbeOutput(stdout, case.get("stderr", ""), status)


def as_json(value: Any) -> Any:
    """A parsed value as a case records it: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value))
