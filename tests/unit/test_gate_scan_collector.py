"""The gate scan runs with the cyclic garbage collector off (its passes over the scan's AST nodes
were ~18% of a large scan's CPU), and gives it back to a caller that runs it in process."""

import gc

from gpuops.remote import gate_scan

MODULE = '''import torch


def is_sm100_supported():
    return torch.cuda.get_device_capability()[0] == 10


def forward(x):
    if is_sm100_supported():
        return x * 2
    return x
'''


def _scan_counting_collections(tmp_path):
    pkg = tmp_path / "sglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for i in range(20):
        (pkg / f"m{i}.py").write_text(MODULE)
    started = []

    def count(phase, info):
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        result = gate_scan.scan({"root": str(pkg), "jobs": 1})
    finally:
        gc.callbacks.remove(count)
    assert result["ok"] and len(result["gates"]) == 20
    return started


def test_no_collection_during_the_scan_and_the_collector_is_back_after(tmp_path):
    assert gc.isenabled()
    assert _scan_counting_collections(tmp_path) == []
    assert gc.isenabled()


def test_a_caller_without_the_collector_keeps_it_off(tmp_path):
    gc.disable()
    try:
        _scan_counting_collections(tmp_path)
        assert not gc.isenabled()
    finally:
        gc.enable()
