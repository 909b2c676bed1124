"""GPU facts: the nvidia-smi query table and banner, on the real captures and built variations."""

from __future__ import annotations

import pytest
from facts_fixtures import H200, RTX8, driver_error, fixture_text, not_found, ok

from gpuops.facts.arch import identify
from gpuops.facts.gpu import parse_banner, parse_query, parse_query_csv
from gpuops.gather import ProbeOutput


@pytest.mark.parametrize(
    ("cc", "name", "sm", "arch"),
    [
        ("9.0", "NVIDIA H100 80GB HBM3", "sm90", "Hopper"),
        ("9.0", "NVIDIA H200", "sm90", "Hopper"),
        ("10.0", "NVIDIA B200", "sm100", "Blackwell"),
        ("10.3", "NVIDIA B300 SXM6 AC", "sm103", "Blackwell"),
        ("12.0", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "sm120", "Blackwell"),
        ("12.0", "NVIDIA GeForce RTX 5090", "sm120", "Blackwell"),
        ("12.1", "NVIDIA GB10", "sm121", "Blackwell"),
        ("8.0", "NVIDIA A100-SXM4-80GB", "sm80", "Ampere"),
        ("8.9", "NVIDIA L40S", "sm89", "Ada Lovelace"),
    ],
)
def test_compute_capability_is_authoritative(cc: str, name: str, sm: str, arch: str) -> None:
    found = identify(cc, name)
    assert (found.compute_capability, found.sm, found.arch, found.source) == (cc, sm, arch, "compute_cap")


@pytest.mark.parametrize(
    ("name", "cc"),
    [
        ("NVIDIA H200", "9.0"),
        ("NVIDIA H100 PCIe", "9.0"),
        ("NVIDIA H20", "9.0"),
        ("NVIDIA GH200 480GB", "9.0"),
        ("NVIDIA B200", "10.0"),
        ("NVIDIA GB200", "10.0"),
        ("NVIDIA B300 SXM6 AC", "10.3"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0"),
        ("NVIDIA GeForce RTX 5080", "12.0"),
        ("NVIDIA GB10", "12.1"),
        ("NVIDIA A100-SXM4-40GB", "8.0"),
        ("NVIDIA L40S", "8.9"),
        ("NVIDIA A10G", "8.6"),
    ],
)
def test_name_is_only_a_fallback(name: str, cc: str) -> None:
    found = identify("[N/A]", name)
    assert found.compute_capability == cc
    assert found.source == "name"


def test_the_compute_capability_wins_over_a_misleading_name() -> None:
    # A name says Hopper but the driver reports 12.0: the driver is right.
    assert identify("12.0", "NVIDIA H100").sm == "sm120"


def test_unknown_gpu_is_unknown_not_guessed() -> None:
    found = identify(None, "Some Future Accelerator")
    assert (found.sm, found.arch, found.source) == (None, None, "unknown")


def test_real_h200_query_byte_for_byte() -> None:
    query = parse_query(ok(fixture_text(H200, "query.csv")))
    assert query.known and len(query.gpus) == 1
    gpu = query.gpus[0]
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert (gpu.compute_capability, gpu.sm, gpu.arch) == ("9.0", "sm90", "Hopper")
    assert gpu.memory_total_mib == 143771
    assert gpu.memory_used_mib == 0
    assert gpu.driver_version == "580.159.04"
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert (gpu.pcie_gen, gpu.pcie_width) == (5, 16)
    assert gpu.power_limit_w == 700.0
    assert gpu.clocks_max_sm_mhz == 1980


def test_synthetic_rtx_pro_6000_query() -> None:
    query = parse_query(ok(fixture_text(RTX8, "query.csv")))
    assert [g.index for g in query.gpus] == list(range(8))
    assert {g.sm for g in query.gpus} == {"sm120"}
    assert {g.compute_capability for g in query.gpus} == {"12.0"}
    assert {g.arch for g in query.gpus} == {"Blackwell"}
    assert {g.memory_total_mib for g in query.gpus} == {97887}
    assert query.gpus[7].pci_bus_id == "00000000:DB:00.0"
    assert query.gpus[3].uuid == "GPU-00000003-0000-0000-0000-000000000000"


def test_real_banner_gives_driver_and_cuda_version() -> None:
    banner = parse_banner(ok(fixture_text(H200, "smi.txt")))
    assert (banner.driver_version, banner.cuda_driver_version) == ("580.159.04", "13.0")


def test_nvidia_smi_q_also_gives_the_cuda_version() -> None:
    banner = parse_banner(ok(fixture_text(H200, "smi_q.txt")))
    assert (banner.driver_version, banner.cuda_driver_version) == ("580.159.04", "13.0")


def test_columns_are_found_by_name_and_missing_ones_fall_back() -> None:
    # An older driver without compute_cap, and the columns in another order.
    text = (
        "name, index, memory.total [MiB], pcie.link.gen.max\n"
        "NVIDIA A100-SXM4-80GB, 0, 81920 MiB, 4\n"
        "NVIDIA L40S, 1, 46068 MiB, [N/A]\n"
    )
    a100, l40s = parse_query_csv(text)
    assert (a100.index, a100.sm, a100.sm_source, a100.memory_total_mib, a100.pcie_gen) == (0, "sm80", "name", 81920, 4)
    assert (l40s.index, l40s.sm, l40s.arch, l40s.pcie_gen, l40s.uuid) == (1, "sm89", "Ada Lovelace", None, None)


def test_mixed_gpus_keep_their_own_sm() -> None:
    text = (
        "index, uuid, name, compute_cap, memory.total [MiB]\n"
        "0, GPU-a, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB\n"
        "1, GPU-b, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 97887 MiB\n"
    )
    gpus = parse_query_csv(text)
    assert [g.sm for g in gpus] == ["sm90", "sm120"]


def test_driver_error_is_unknown_with_reason() -> None:
    for parse in (parse_query, parse_banner):
        value = parse(driver_error())
        assert value.known is False
        assert "cannot communicate with the NVIDIA driver" in value.reason
        assert "exit status 9" in value.reason


def test_missing_nvidia_smi_is_unknown_with_reason() -> None:
    value = parse_query(not_found())
    assert value.known is False
    assert "nvidia-smi not found" in value.reason
    assert value.gpus == ()


def test_other_failures_name_the_status_and_first_line() -> None:
    value = parse_query(ProbeOutput("", "Failed to initialize NVML: Unknown Error\n", 255))
    assert value.known is False
    assert "255" in value.reason and "Failed to initialize NVML" in value.reason
    assert "did not answer" in parse_query(ProbeOutput("", "", 124)).reason


def test_header_only_means_no_gpus() -> None:
    value = parse_query(ok("index, uuid, name, compute_cap\n"))
    assert value.known is False and value.reason == "nvidia-smi listed no GPUs"
