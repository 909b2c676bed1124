"""apply gathers the GPU facts from the same probes inspect does (apply/host_gather.gpu_probes_for builds
them without importing the whole facts package): same names, scripts and parsers."""

from __future__ import annotations

from gpuops.apply.host_gather import gpu_probes_for as _gpu_probes
from gpuops.facts.host import probes_for
from gpuops.inventory import Host


def test_apply_gathers_exactly_the_gpu_and_package_probes_of_inspect() -> None:
    host = Host(name="h1", address="127.0.0.1", port=22, user="u", key_file=None, connection="ssh", groups=(),
                vars={"gpuops_state_dir": "/var/lib/gpuops"})
    inspect_probes = [p for p in probes_for(host) if p.name.startswith("gpu.") or p.name == "software.python"]
    apply_probes = _gpu_probes(host)
    assert [p.name for p in apply_probes] == [p.name for p in inspect_probes]
    assert len(apply_probes) == 6
    for mine, theirs in zip(apply_probes, inspect_probes):
        assert (mine.script, mine.start, mine.parse) == (theirs.script, theirs.start, theirs.parse), mine.name
