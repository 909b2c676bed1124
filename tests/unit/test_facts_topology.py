"""Interconnect facts: `topo -m` (ANSI escapes and all) and `topo -p2p r`, real and built shapes."""

from __future__ import annotations

from facts_fixtures import H200, RTX8, driver_error, fixture_text, not_found, ok, p2p_matrix, topo_matrix

from gpuops.facts.topology import (
    P2PMatrix,
    TopologyMatrix,
    parse_p2p,
    parse_p2p_text,
    parse_topo,
    parse_topo_text,
    summarize,
)


def test_real_h200_topology_with_ansi_escapes() -> None:
    raw = fixture_text(H200, "topo.txt")
    assert "\x1b[4m" in raw  # the capture really has them
    topo = parse_topo_text(raw)
    assert topo.known
    assert topo.devices == ("GPU0",)
    assert topo.links == {"GPU0": {"GPU0": "X"}}
    assert topo.affinity["GPU0"].cpu_affinity == "0-15"
    assert topo.affinity["GPU0"].numa_node == "0"


def test_real_h200_single_gpu_summary() -> None:
    ic = summarize(parse_topo_text(fixture_text(H200, "topo.txt")), parse_p2p_text(fixture_text(H200, "p2p.txt")))
    assert ic.nvlink is False
    assert ic.p2p_all_pairs is True  # no pair exists, so none fails
    assert ic.matrix == {"GPU0": {"GPU0": "X"}}
    assert ic.warnings == ()


def test_rtx_pro_6000_two_sockets_pcie_only() -> None:
    topo = parse_topo_text(fixture_text(RTX8, "topo.txt"))
    p2p = parse_p2p_text(fixture_text(RTX8, "p2p.txt"))
    ic = summarize(topo, p2p)
    assert ic.nvlink is False
    assert ic.link_counts == {"NODE": 12, "SYS": 16}
    assert ic.matrix["GPU0"]["GPU3"] == "NODE"
    assert ic.matrix["GPU0"]["GPU4"] == "SYS"
    assert {g: a.numa_node for g, a in ic.numa.items()} == {f"GPU{i}": "0" if i < 4 else "1" for i in range(8)}
    assert ic.numa["GPU5"].cpu_affinity == "32-63,96-127"
    assert ic.p2p_all_pairs is False
    assert len(ic.p2p_failed_pairs) == 16
    assert ("GPU0", "GPU4", "CNS") in ic.p2p_failed_pairs
    assert ("GPU0", "GPU1", "OK") not in ic.p2p_failed_pairs
    p2p_warning = next(w for w in ic.warnings if "peer-to-peer" in w)
    assert "16 of 28 GPU pairs" in p2p_warning
    assert "custom all-reduce" in p2p_warning
    assert "chipset not supported" in p2p_warning
    assert any("inter-socket" in w for w in ic.warnings)


def _nvlink_box() -> str:
    links = [["X" if i == j else "NV18" for j in range(8)] for i in range(8)]
    affinity = [("0-55,112-167", "0")] * 4 + [("56-111,168-223", "1")] * 4
    return topo_matrix(links, affinity, nics=2)


def test_nvlink_nv18_eight_gpus_with_nics() -> None:
    topo = parse_topo_text(_nvlink_box())
    assert topo.devices[:8] == tuple(f"GPU{i}" for i in range(8))
    assert topo.devices[8:] == ("NIC0", "NIC1")
    ic = summarize(topo, parse_p2p_text(p2p_matrix([["X" if i == j else "OK" for j in range(8)] for i in range(8)])))
    assert ic.nvlink is True
    assert ic.link_counts == {"NV18": 28}
    assert set(ic.matrix) == {f"GPU{i}" for i in range(8)}  # NICs are not GPUs
    assert ic.numa["GPU7"].numa_node == "1"
    assert ic.p2p_all_pairs is True
    assert ic.warnings == ()


def test_partial_nvlink_is_still_nvlink() -> None:
    links = [["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]]
    ic = summarize(parse_topo_text(topo_matrix(links, [("0-7", "0")] * 3)), P2PMatrix(known=False, reason="x"))
    assert ic.nvlink is True
    assert ic.link_counts == {"NV4": 1, "SYS": 2}
    assert ic.p2p_all_pairs is None


def test_one_way_p2p_failure_counts() -> None:
    status = [["X", "OK"], ["GNS", "X"]]
    ic = summarize(TopologyMatrix(known=False, reason="x"), parse_p2p_text(p2p_matrix(status)))
    assert ic.p2p_all_pairs is False
    assert ic.p2p_failed_pairs == (("GPU0", "GPU1", "GNS"),)


def test_failures_are_unknown_with_reason() -> None:
    topo = parse_topo(driver_error())
    p2p = parse_p2p(not_found())
    assert not topo.known and "NVIDIA driver" in topo.reason
    assert not p2p.known and "not found" in p2p.reason
    ic = summarize(topo, p2p)
    assert (ic.known, ic.nvlink, ic.p2p_all_pairs) == (False, None, None)
    assert ic.reason == topo.reason


def test_garbage_is_unknown_not_a_crash() -> None:
    assert parse_topo(ok("something else entirely\n")).known is False
    assert parse_p2p(ok("\x1b[4m\x1b[0m\n\n")).known is False
