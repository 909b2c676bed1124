"""Each kept result's key holds every input the result depends on (gpuops/memo.py's one scheme).

Per memo: the same inputs make the same key, and changing any one input (each listed in
docs/ARCHITECTURE.md's table) makes another key. A key that stops digesting one of them (the
one-line bug that serves a stale plan, verdict or GPU summary) fails here, naming the input.
What a key does not hold by design is checked to stay out (a pid that comes and goes).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from gpuops import memo
from gpuops.apply import kept_facts, noop_memo
from gpuops.gates import judge_memo, probe, scan_cache
from gpuops.gates.scan import GateScan
from gpuops.inventory.model import Host
from gpuops.plan.entrypoint import LaunchEntry
from gpuops.plan.model import FileState, PlanFacts
from gpuops.shipping import bundle_cache


@pytest.fixture(autouse=True)
def _keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))


def _another_gpuops(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpuops upgraded or edited (its code, a role, a template: what code_digest walks)."""
    monkeypatch.setattr(memo, "code_digest", lambda: "0" * 64)
    monkeypatch.setattr(noop_memo, "code_digest", lambda: "0" * 64)
    monkeypatch.setattr(memo, "package_digest", lambda: "0" * 64)


def _each_input_counts(make: Callable[..., Any], base: dict[str, Any], changes: dict[str, Any],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    first = make(**base)
    assert first is not None and make(**base) == first
    for name, value in changes.items():
        assert make(**{**base, name: value}) != first, f"the key ignores {name}"
    _another_gpuops(monkeypatch)
    assert make(**base) != first, "the key ignores gpuops' own code"


SCAN = GateScan(known=True, root="/site/sglang", version="0.5.8", python="3.11.7", fingerprint="a" * 64,
                sources={"srt/layers/communicator.py": "text"})
HOST = Host(name="h01", address="10.0.0.1", port=22, user="root", key_file=None, connection="ssh", groups=("all",))


def test_verdicts_key_on_the_scan_and_every_fact_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    server = {"args": {"--tp": 8}, "version": "0.5.8", "others": [{"pid": 1}]}
    base = {"scan": SCAN, "compute_capability": "12.0", "cuda": "12.8", "server": server,
            "interconnect": {"nvlink": False, "p2p_all_pairs": True}}
    _each_input_counts(judge_memo.memo_key, base, {
        "scan": dataclasses.replace(SCAN, fingerprint="b" * 64),
        "compute_capability": "9.0", "cuda": "13.0",
        "server": {**server, "args": {"--tp": 4}},
        "interconnect": {"nvlink": True, "p2p_all_pairs": True},
    }, monkeypatch)
    with_other_sources = {**base, "scan": dataclasses.replace(SCAN, sources={"srt/layers/communicator.py": "edited"})}
    assert judge_memo.memo_key(**with_other_sources) != judge_memo.memo_key(**base)
    # the other servers on the host come and go; judging never reads them (test_scan_cache holds that)
    assert judge_memo.memo_key(**{**base, "server": {**server, "others": []}}) == judge_memo.memo_key(**base)


def test_no_op_plans_key_on_the_role_the_facts_and_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"/state/sglang.env": FileState("/state/sglang.env", True, "0" * 64, "0600", 0, 0, "A='1'\n")}
    facts = PlanFacts(host="h01", files=files, gate_scan=SCAN, gpu={"compute_capability": "12.0", "cuda": "13.0"},
                      container=None)
    base = {"role": "fusion-sm120", "facts": facts, "inventory_vars": {"sglang_port": 30000}, "extra_vars": {}}
    edited = {"/state/sglang.env": dataclasses.replace(files["/state/sglang.env"], content="A='2'\n", sha256="1" * 64)}
    changes = {
        "role": "nccl-env",
        "inventory_vars": {"sglang_port": 30001}, "extra_vars": {"x": 1},
    }
    per_field = {
        "host": "h02", "files": edited, "gpu": {"compute_capability": "9.0", "cuda": "13.0"},
        "gate_scan": dataclasses.replace(SCAN, fingerprint="b" * 64), "container": {"image": "lmsysorg/sglang:v1"},
        # issue 41: whether a server runs (a start is planned) and how each launch python is launched
        "server_running": True,
        "entrypoints": {"/opt/sglang/bin/python": LaunchEntry("/opt/sglang/bin/python", "serve", "/opt/sglang/bin/sglang",
                                                              "SGLang 0.5.20 recommends sglang serve")},
    }
    # every field of PlanFacts is an input: one added later must be listed here
    assert set(per_field) == {f.name for f in dataclasses.fields(PlanFacts)}
    for name, value in per_field.items():
        changes[f"facts.{name}"] = dataclasses.replace(facts, **{name: value})

    def make(role: str, facts: PlanFacts, inventory_vars: dict, extra_vars: dict, **other: PlanFacts) -> Any:
        for replaced in other.values():
            facts = replaced
        return noop_memo.plan_key(role, facts, inventory_vars, extra_vars)

    _each_input_counts(make, base, changes, monkeypatch)
    sources = dataclasses.replace(SCAN, sources={"srt/layers/communicator.py": "edited"})
    assert noop_memo.plan_key(**{**base, "facts": dataclasses.replace(facts, gate_scan=sources)}) != make(**base)
    # a scan the host could not pin down (no fingerprint) is never keyed
    assert noop_memo.plan_key(**{**base, "facts": dataclasses.replace(facts, gate_scan=dataclasses.replace(SCAN, fingerprint=None))}) is None


def test_discoveries_key_on_the_role_the_host_and_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"role": "fusion-sm120", "host": "h01", "inventory_vars": {"a": 1}, "extra_vars": {}}
    _each_input_counts(noop_memo.discovery_key, base,
                       {"role": "nccl-env", "host": "h02", "inventory_vars": {"a": 2}, "extra_vars": {"a": 1}},
                       monkeypatch)


def test_gpu_facts_key_on_how_the_host_is_reached_and_gpuops_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(**fields: Any) -> Any:
        return kept_facts.host_key(dataclasses.replace(HOST, **fields))

    _each_input_counts(make, {}, {"name": "h02", "address": "10.0.0.2", "port": 2222, "user": "admin",
                                  "connection": "local"}, monkeypatch)


def test_scans_are_scoped_per_host_and_keyed_by_the_hosts_fingerprint() -> None:
    base = memo.host_identity(HOST)
    for name, value in {"name": "h02", "address": "10.0.0.2", "port": 2222, "user": "admin", "connection": "local"}.items():
        assert memo.host_identity(dataclasses.replace(HOST, **{name: value})) != base, name
    cache = scan_cache.for_host(HOST)
    assert cache is not None
    scan = {"scanner": 1, "ok": True, "fingerprint": "c" * 64, "gates": [], "version": "0.5.8"}
    from gpuops.gates.scan import SUPPORTED_SCANNER

    scan["scanner"] = SUPPORTED_SCANNER
    cache.store(scan, has_sources=False)
    assert set(cache.offer(need_sources=False).fingerprints()) == {"c" * 64}
    other = scan_cache.for_host(dataclasses.replace(HOST, port=2222))
    assert other is not None and not other.holds("c" * 64)  # its own scope holds nothing
    # With none of its own, the other host is offered this one's (used only where its tree is this tree).
    assert set(other.offer(need_sources=False).fingerprints()) == {"c" * 64}


def test_catalog_values_key_on_the_file_and_gpuops_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("features: {}\n")
    first = probe.catalog_key("patch-keywords", path)
    assert first is not None and probe.catalog_key("patch-keywords", path) == first
    assert probe.catalog_key("kernel-reads", path) != first
    os.utime(path, ns=(1, 1))
    assert probe.catalog_key("patch-keywords", path) != first  # mtime
    mtime = probe.catalog_key("patch-keywords", path)
    path.write_text("features: {} \n")
    os.utime(path, ns=(1, 1))
    assert probe.catalog_key("patch-keywords", path) != mtime  # size
    sized = probe.catalog_key("patch-keywords", path)
    replacement = tmp_path / "new.yaml"
    replacement.write_text("features: {}!\n")
    os.utime(replacement, ns=(1, 1))
    os.replace(replacement, path)
    assert probe.catalog_key("patch-keywords", path) != sized  # inode (same size and mtime)
    other = tmp_path / "other.yaml"
    other.write_text(path.read_text())
    assert probe.catalog_key("patch-keywords", other) != probe.catalog_key("patch-keywords", path)  # path
    before = probe.catalog_key("patch-keywords", path)
    _another_gpuops(monkeypatch)
    assert probe.catalog_key("patch-keywords", path) != before


def test_bundles_key_on_the_entry_and_its_directory(tmp_path: Path) -> None:
    base = bundle_cache.bundle_key("gate_scan", tmp_path)
    assert base is not None and bundle_cache.bundle_key("gate_scan", tmp_path) == base
    assert bundle_cache.bundle_key("apply_helper", tmp_path) != base
    assert bundle_cache.bundle_key("gate_scan", tmp_path / "other") != base
    # the files a script came from are checked by their stamps on reading (test_remote_bundle)
