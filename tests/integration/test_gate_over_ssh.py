"""The gate scan over real OpenSSH (lab hosts on 127.0.0.1): the probe runs inside the one gather
exec, with the python the preamble picks (the stand-in server's, which sees the lab's release)."""

from __future__ import annotations

import pytest

from gpuops.lab.hosts import LabSpec

pytestmark = pytest.mark.integration


def scan_hosts(lab):
    from gpuops.facts.python_select import preamble_for_vars
    from gpuops.gates.probe import gate_scan_probe
    from gpuops.gather import gather
    from gpuops.inventory import load_inventory
    from gpuops.transport import ConnectOptions, connect

    scans = {}
    for host in load_inventory(str(lab.inventory_path)).select(None):
        conn = connect(host, ConnectOptions())
        try:
            scans[host.name] = gather(conn, [gate_scan_probe(with_sources=True)],
                                      preamble=preamble_for_vars(dict(host.vars)))["gates.scan"]
        finally:
            conn.close()
    return scans


def test_scan_over_ssh_judges_each_host_for_its_own_gpu(lab_factory):
    from gpuops.gates.evaluate import judge

    lab = lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.14", names=("pro6000",)),
                      LabSpec(gpu="h200-x1", sglang="0.5.14", names=("h200",)),
                      LabSpec(gpu="h200-x1", sglang=None, server=False, names=("bare",)))
    scans = scan_hosts(lab)
    for name in ("pro6000", "h200"):
        scan = scans[name]
        assert scan.known, scan.reason
        assert scan.version == "0.5.14"
        host = next(h for h in lab.hosts if h.name == name)
        assert scan.root is not None and scan.root.startswith(str(host.dir))  # that host's own install
        assert "srt/layers/flashinfer_comm_fusion.py" in scan.sources
    assert judge(scans["pro6000"], "12.0", "12.8").features["flashinfer_allreduce_fusion"]["status"] == "blocked"
    assert judge(scans["h200"], "9.0", "13.0").features["flashinfer_allreduce_fusion"]["status"] == "open"
    bare = scans["bare"]
    assert not bare.known and "sglang is not installed" in (bare.reason or "")
    assert judge(bare, "9.0", "13.0").features["flashinfer_allreduce_fusion"]["status"] == "unknown"
