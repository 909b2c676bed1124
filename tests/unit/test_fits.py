"""The host's shape against the catalog's ``fits:`` (gates/fits.py), with what the host's release
says at each ``at:`` (the software probe's reads as a host sends them)."""

from __future__ import annotations

from gpuops.gates.catalog import load_catalog
from gpuops.gates.fits import HostShape, decide, judge_fits
from gpuops.gates.kernels import KernelStatus, KernelVerdict

PCIE_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
# What the probe reads in SGLang 0.5.23 (lines of the real file).
READS = {"sglang": {"root": "/site/sglang", "files": {PCIE_FILE: {"exists": True, "anchors": {
    "^_SUPPORTED_WORLD_SIZES\\s*=": [77, "_SUPPORTED_WORLD_SIZES = (2, 4, 8)"],
    "inp\\.dtype is not torch\\.bfloat16": [397, "if inp.dtype is not torch.bfloat16:"],
    "^\\s*if deterministic:": [111, "if deterministic:"]}}}}}
FIELD = HostShape(tp_size=8, dtype="bfloat16", deterministic=False, nvlink=False, p2p_gaps=(), capability="12.0",
                  server_args={"tp_size": 8}, server_env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})


def pcie():
    return load_catalog().feature("pcie_ipc_allreduce")


def holds(shape: HostShape, reads=READS) -> dict:
    return {v.fit.kind: v.holds for v in judge_fits(pcie(), shape, reads)}


def test_the_pcie_ipc_allreduce_fits_the_field_box() -> None:
    assert holds(FIELD) == {"tp_size": True, "dtype": True, "deterministic": True, "interconnect": True, "p2p": True}


def test_each_misfit_is_named_with_the_releases_line() -> None:
    import dataclasses

    cases = {
        "tp_size": (dataclasses.replace(FIELD, tp_size=16), "TP 16 is not among the sizes it serves (2, 4, 8) "
                    f"(sglang/{PCIE_FILE}:77)"),
        "dtype": (dataclasses.replace(FIELD, dtype="float16"), "the model is float16; it serves bfloat16 only"),
        "deterministic": (dataclasses.replace(FIELD, deterministic=True), "deterministic inference turns it off "
                          f"(sglang/{PCIE_FILE}:111)"),
        "interconnect": (dataclasses.replace(FIELD, nvlink=True), "for PCIe-only hosts; NVLink all-reduce is already fast"),
        "p2p": (dataclasses.replace(FIELD, p2p_gaps=("GPU0-GPU4 (CNS)",)), "1 pair(s) lack it: GPU0-GPU4 (CNS)"),
    }
    for kind, (shape, text) in cases.items():
        verdicts = {v.fit.kind: v for v in judge_fits(pcie(), shape, READS)}
        assert verdicts[kind].holds is False and text in verdicts[kind].reason, (kind, verdicts[kind].reason)
        assert [k for k, v in verdicts.items() if v.holds is False] == [kind]


def test_the_hosts_own_list_of_sizes_wins_over_the_catalogs() -> None:
    reads = {"sglang": {"files": {PCIE_FILE: {"exists": True, "anchors": {
        "^_SUPPORTED_WORLD_SIZES\\s*=": [70, "_SUPPORTED_WORLD_SIZES = (2, 4, 8, 16)"]}}}}}
    import dataclasses

    assert holds(dataclasses.replace(FIELD, tp_size=16), reads)["tp_size"] is True


def test_decided_by_needs_and_fits_and_in_effect_by_its_switch() -> None:
    need = pcie().kernels[0]
    opened = [KernelVerdict(need, KernelStatus.OPEN, "SGLang 0.5.23 has it")]
    verdict = decide(pcie(), {"status": "unknown", "reason": "no gate found"}, opened,
                     judge_fits(pcie(), FIELD, READS), FIELD)
    assert verdict["status"] == "open" and verdict["in_effect"] is True
    assert verdict["reason"].endswith("off by default: launch with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1")
    import dataclasses

    off = dataclasses.replace(FIELD, server_env={})
    assert decide(pcie(), {}, opened, judge_fits(pcie(), off, READS), off)["in_effect"] is False
    blocked = [KernelVerdict(need, KernelStatus.BLOCKED, "SGLang 0.5.8 has no it")]
    verdict = decide(pcie(), {}, blocked, judge_fits(pcie(), FIELD, READS), FIELD)
    assert verdict["status"] == "blocked" and verdict["in_effect"] is False
    # No server: what cannot be told is said, the feature is not called blocked for it.
    bare = HostShape(capability="12.0", nvlink=False)
    verdict = decide(pcie(), {}, opened, judge_fits(pcie(), bare, READS), bare)
    assert verdict["status"] == "open" and verdict["in_effect"] is None and "not known here" in verdict["reason"]


def test_custom_allreduce_is_off_on_more_than_two_pcie_only_gpus() -> None:
    feature = load_catalog().feature("custom_allreduce")
    import dataclasses

    for tp, nvlink, want in ((8, False, False), (2, False, True), (8, True, True)):
        shape = dataclasses.replace(FIELD, tp_size=tp, nvlink=nvlink)
        (limit, _p2p) = judge_fits(feature, shape, {})
        assert limit.holds is want, (tp, nvlink, limit.reason)


def test_torch_symm_mem_sizes_by_capability_major() -> None:
    feature = load_catalog().feature("torch_symm_mem")
    file = "srt/distributed/device_communicators/all_reduce_utils.py"
    reads = {"sglang": {"files": {file: {"exists": True, "dicts": {"TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES": [3, [9, 10]]}}}}}
    import dataclasses

    (fit,) = judge_fits(feature, FIELD, reads)
    assert fit.holds is False and fit.where == f"sglang/{file}:3" and "none for 12" in fit.reason
    (fit,) = judge_fits(feature, dataclasses.replace(FIELD, capability="10.0"), reads)
    assert fit.holds is True
    (fit,) = judge_fits(feature, FIELD, {})
    assert fit.holds is None


def test_hostile_reads_never_crash() -> None:
    for bad in ({"sglang": {"files": {PCIE_FILE: {"exists": True, "anchors": "x"}}}},
                {"sglang": {"files": {PCIE_FILE: {"exists": True, "anchors": {"^_SUPPORTED_WORLD_SIZES\\s*=": "x"}}}}},
                {"sglang": {"files": []}}, {"sglang": "x"}, []):
        assert holds(FIELD, bad)["tp_size"] is True  # the catalog's own sizes, no line cited
    feature = load_catalog().feature("torch_symm_mem")
    file = "srt/distributed/device_communicators/all_reduce_utils.py"
    (fit,) = judge_fits(feature, FIELD, {"sglang": {"files": {file: {"exists": True, "dicts": ["x"]}}}})
    assert fit.holds is None


def test_custom_allreduce_in_effect_from_the_servers_resolved_settings() -> None:
    """The server's word first (issue 26): ``disable_custom_all_reduce`` in its resolved settings
    decides, and the judgement from its flags is named beside it; a blocked fit still wins."""
    import dataclasses

    feature = load_catalog().feature("custom_allreduce")
    need = feature.kernels[0]
    opened = [KernelVerdict(need, KernelStatus.OPEN, "SGLang has it")]

    def decided(shape: HostShape) -> dict:
        return decide(feature, {}, opened, judge_fits(feature, shape, {}), shape)

    two = dataclasses.replace(FIELD, tp_size=2, server_args={"tp_size": 2})
    report = {"route": "/server_info", "settings": {"disable_custom_all_reduce": False}}
    agreed = decided(dataclasses.replace(two, server_report=report))
    assert agreed["in_effect"] is True and agreed["in_effect_reason"].startswith(
        "the server reports disable_custom_all_reduce=False in its resolved settings (/server_info); "
        "gpuops' own judgement agrees"), agreed["in_effect_reason"]
    # The launch flags say nothing about it, the server resolved it off: the server's word is taken.
    off = {"route": "/server_info", "settings": {"disable_custom_all_reduce": True}}
    taken = decided(dataclasses.replace(two, server_report=off))
    assert taken["in_effect"] is False and "the server's word is taken; gpuops' own judgement says on" in \
        taken["in_effect_reason"], taken["in_effect_reason"]
    # Eight PCIe-only GPUs: SGLang turns it off itself, whatever the setting says.
    eight = decided(dataclasses.replace(FIELD, server_report=report))
    assert eight["status"] == "blocked" and eight["in_effect"] is False
    assert "but it does not run on this host" in eight["in_effect_reason"]
    # A report that names none of its settings, or failed: the judgement from the flags stands.
    for unsaid in ({"route": "/server_info", "settings": {}}, {"route": "/server_info", "error": "HTTP 500"}):
        plain = decided(dataclasses.replace(two, server_report=unsaid))
        assert plain["in_effect"] is True and "resolved settings" not in plain["in_effect_reason"]


def test_a_setting_the_server_reports_as_null_reads_null_never_none() -> None:
    """SGLang's /server_info reports attention_backend null when it chooses at start-up: the
    in-effect text says null (its JSON spelling), not Python's None (seen in gpuops advise on the lab's H100)."""
    from gpuops.gates.in_effect import reported_state

    fa3 = load_catalog().feature("fa3")
    said, text = reported_state(fa3, {"reported": {"settings": {"attention_backend": None}}})
    assert said is False and text == "the server reports attention_backend=null", text
    said, text = reported_state(fa3, {"reported": {"settings": {"attention_backend": "fa3"}}})
    assert said is True and text == "the server reports attention_backend='fa3'"
