"""NCCL variable checks: names, values, cross-variable rules and field warnings (pure)."""

from __future__ import annotations

import pytest

from gpuops.nccl import NcclSettingError, check_nccl_env, check_nccl_variable, nccl_warnings


@pytest.mark.parametrize(
    "name, value",
    [
        ("NCCL_ALGO", "Ring"),
        ("NCCL_ALGO", "Ring,Tree"),
        ("NCCL_ALGO", "^Tree"),
        ("NCCL_ALGO", "nvls,nvlstree"),
        ("NCCL_ALGO", "allreduce:tree,ring;allgather:ring"),
        ("NCCL_PROTO", "LL,LL128,Simple"),
        ("NCCL_PROTO", "^LL128"),
        ("NCCL_P2P_LEVEL", "SYS"),
        ("NCCL_P2P_LEVEL", "5"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_IB_DISABLE", 1),
        ("NCCL_NVLS_ENABLE", False),
        ("NCCL_NTHREADS", "512"),
        ("NCCL_NTHREADS", 64),
        ("NCCL_BUFFSIZE", "8388608"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,COLL"),
        ("NCCL_DEBUG_SUBSYS", "^PROXY"),
        ("NCCL_SOCKET_IFNAME", "^lo,docker"),
        ("NCCL_LAUNCH_MODE", "GROUP"),
        ("NCCL_CUMEM_ENABLE", "0"),
    ],
)
def test_accepted(name: str, value: object) -> None:
    check_nccl_variable(name, value, "test")


def test_typo_in_a_name_suggests_the_real_one() -> None:
    with pytest.raises(NcclSettingError) as info:
        check_nccl_variable("NCCL_ALGOS", "Ring", "inventory h01")
    message = str(info.value)
    assert "inventory h01" in message
    assert "NCCL_ALGOS" in message and "did you mean NCCL_ALGO?" in message


def test_bad_value_lists_the_choices() -> None:
    with pytest.raises(NcclSettingError) as info:
        check_nccl_variable("NCCL_PROTO", "fast", "x")
    assert "'fast'" in str(info.value)
    assert "LL, LL128, Simple" in str(info.value)


def test_bad_algorithm_in_a_list_gets_a_hint() -> None:
    with pytest.raises(NcclSettingError) as info:
        check_nccl_variable("NCCL_ALGO", "Ring,Tre", "x")
    assert "'Tre'" in str(info.value) and "did you mean Tree?" in str(info.value)


@pytest.mark.parametrize(
    "name, value",
    [
        ("NCCL_NTHREADS", "96"),
        ("NCCL_NTHREADS", "1024"),
        ("NCCL_NTHREADS", "32"),
        ("NCCL_P2P_LEVEL", "6"),
        ("NCCL_P2P_LEVEL", "NVLINK"),
        ("NCCL_DEBUG", "DEBUG"),
        ("NCCL_NVLS_ENABLE", "2"),
        ("NCCL_BUFFSIZE", "big"),
        ("NCCL_ALGO", ""),
        ("NCCL_ALGO", "Ring,,Tree"),
        ("NCCL_ALGO", "allgathr:ring"),
        ("NCCL_LAUNCH_MODE", "SERIAL"),
    ],
)
def test_refused(name: str, value: str) -> None:
    with pytest.raises(NcclSettingError):
        check_nccl_variable(name, value, "x")


def test_env_checks_only_nccl_names_and_channel_order() -> None:
    check_nccl_env({"SGLANG_ANYTHING": "x", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_MIN_NCHANNELS": "4"}, "x")
    with pytest.raises(NcclSettingError, match="above NCCL_MAX_NCHANNELS"):
        check_nccl_env({"NCCL_MIN_NCHANNELS": "16", "NCCL_MAX_NCHANNELS": "8"}, "x")


def test_tree_warning_comes_from_the_field_report() -> None:
    warnings = nccl_warnings({"NCCL_ALGO": "Tree"})
    assert len(warnings) == 1 and "CUDA graph capture" in warnings[0]
    assert nccl_warnings({"NCCL_ALGO": "^Tree"}) == []
    assert nccl_warnings({"NCCL_ALGO": "Ring"}) == []
    # With CUDA graphs off the capture failure cannot happen.
    assert nccl_warnings({"NCCL_ALGO": "Tree"}, ["--disable-cuda-graph"]) == []


def test_other_warnings() -> None:
    assert any("LL128" in w for w in nccl_warnings({"NCCL_PROTO": "LL128"}))
    assert nccl_warnings({"NCCL_PROTO": "^LL128"}) == []
    assert any("TRACE" in w for w in nccl_warnings({"NCCL_DEBUG": "TRACE"}))
    assert any("host memory" in w for w in nccl_warnings({"NCCL_P2P_DISABLE": 1}))


def test_operator_can_vouch_for_a_name_gpuops_does_not_know() -> None:
    with pytest.raises(NcclSettingError, match="nccl_allow_unknown"):
        check_nccl_env({"NCCL_FUTURE_KNOB": "1"}, "x")
    check_nccl_env({"NCCL_FUTURE_KNOB": "1"}, "x", frozenset({"NCCL_FUTURE_KNOB"}))
    with pytest.raises(NcclSettingError):  # a known name's value is still checked
        check_nccl_env({"NCCL_PROTO": "fast"}, "x", frozenset({"NCCL_PROTO"}))
