"""``--flush-cache`` deletes what is kept for the selected hosts (memo.forget_hosts), as Ansible's
flag clears the fact cache, then runs as usual: the hosts' GPU facts, no-op plans, discoveries, gate
scans and the verdicts judged from those scans go; other hosts' entries and what is no host's (the
catalog's values, bundled helpers) stay. The entries are written by each kind's own writer, and the
flag is given on the command line (the host is unreachable: the flush comes before any connection)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops import memo
from gpuops.inventory.model import Host


def _host(name: str, port: int) -> Host:
    return Host(name=name, address="127.0.0.1", port=port, user="root", key_file=None, connection="ssh",
                groups=("all",))


def _keep_everything_for(host: Host, fingerprint: str) -> None:
    """One entry of each per-host kind for ``host``, written as each kind writes it."""
    from gpuops.apply import kept_facts, noop_memo
    from gpuops.gates import scan_cache
    from gpuops.gates.evaluate import GateReport
    from gpuops.gates.judge_memo import judge_or_recall
    from gpuops.gates.scan import SUPPORTED_SCANNER, GateScan
    from gpuops.plan.model import Plan

    cache = scan_cache.for_host(host)
    assert cache is not None
    cache.store({"scanner": SUPPORTED_SCANNER, "ok": True, "gates": [], "fingerprint": fingerprint}, has_sources=False)
    scan = GateScan(known=True, root="/s", version="0.5.8", python="3.11", fingerprint=fingerprint)
    judge_or_recall(scan, "12.0", "12.8", None, None,
                    lambda: GateReport(gates=[], features={}, version="0.5.8", gpu="12.0", known=True), host=host.name)
    facts_key = kept_facts.host_key(host)
    assert facts_key is not None
    memo.put(facts_key, {"host": host.name, "fingerprint": None, "dirs": [], "summary": {"gpu_count": 8}})
    plan_key = memo.key(memo.Kind.PLANS, "plan inputs", host.name)
    assert plan_key is not None
    noop_memo.remember(plan_key, Plan(host=host.name, role="nccl-env", changes=(), handlers=(), service=None), None)
    discovery_key = noop_memo.discovery_key("nccl-env", host.name, {}, {})
    assert discovery_key is not None
    memo.put(discovery_key, {"host": host.name, "role": "nccl-env"})


def _counts(root: Path) -> dict[str, int]:
    return {kind.directory: len(list((root / kind.directory).rglob("*.json"))) for kind in memo.Kind}


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*.json"))


def test_forget_hosts_deletes_the_selected_hosts_entries_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))
    a1, a2 = _host("a1", 1), _host("a2", 2)
    _keep_everything_for(a1, "a" * 64)
    _keep_everything_for(a2, "b" * 64)
    catalog_key = memo.key(memo.Kind.CATALOG, "catalog file")
    assert catalog_key is not None
    memo.put(catalog_key, {"values": 1})
    before = _counts(tmp_path / "kept")
    assert before == {"facts": 2, "plans": 2, "discovery": 2, "scans": 2, "judged": 2, "catalog": 1, "bundles": 0}

    assert memo.forget_hosts([a1]) == 5
    assert _counts(tmp_path / "kept") == {**{kind: 1 for kind in ("facts", "plans", "discovery", "scans", "judged")},
                                          "catalog": 1, "bundles": 0}
    left = [memo.get(key)["host"] for key, _ in memo.newest(memo.Kind.FACTS)]  # type: ignore[index]
    assert left == ["a2"]
    from gpuops.gates import scan_cache

    assert not scan_cache.for_host(a1).holds("a" * 64)  # type: ignore[union-attr]
    # With none of its own, a1 is offered the other hosts' newest (used only where its tree is theirs).
    assert set(scan_cache.for_host(a1).offer(False).fingerprints()) == {"b" * 64}  # type: ignore[union-attr]
    assert set(scan_cache.for_host(a2).offer(False).fingerprints()) == {"b" * 64}  # type: ignore[union-attr]
    assert not (tmp_path / "kept" / "scans" / memo.host_identity(a1)).exists()
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    assert memo.forget_hosts([a2]) == 0  # keeping off: nothing to forget, nothing touched


@pytest.mark.parametrize("command", [["inspect", "host"], ["inspect", "gates"], ["advise"],
                                     ["apply", "nccl-env", "--check"]])
def test_the_flag_forgets_the_selected_hosts_before_the_run(command: list[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuops.cli import cli
    from gpuops.lab.ports import free_port

    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))
    port = free_port()  # nothing listens: each host fails at connect, after the flush
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n"
                         f"    a1: {{ansible_host: 127.0.0.1, ansible_port: {port}, ansible_user: root}}\n"
                         f"    a2: {{ansible_host: 127.0.0.1, ansible_port: {port}, ansible_user: root}}\n")
    from gpuops.inventory import load_inventory

    hosts = {h.name: h for h in load_inventory(str(inventory)).hosts}
    kept = tmp_path / "kept"
    _keep_everything_for(hosts["a1"], "a" * 64)
    a1 = _files(kept)
    _keep_everything_for(hosts["a2"], "b" * 64)
    a2 = _files(kept) - a1
    assert len(a1) == len(a2) == 5

    args = [*command, "-i", str(inventory), "-l", "a1"]
    unflushed = CliRunner().invoke(cli, args)
    assert unflushed.exit_code == 1, unflushed.output
    assert a1 | a2 <= _files(kept)  # without the flag nothing is deleted
    flushed = CliRunner().invoke(cli, [*args, "--flush-cache"])
    assert flushed.exit_code == 1, flushed.output  # the run went on as usual (and failed to connect)
    assert not a1 & _files(kept) and a2 <= _files(kept)


def test_entries_at_the_old_paths_are_removed_when_the_new_layout_is_written(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the memo layer each kind kept its entries at ``$GPUOPS_CACHE/<kind>/``; nothing reads
    them now, so the first entry kept in the default place removes them (and only them)."""
    base = tmp_path / "cache"
    old = [base / "scans" / "0123abcd" / f"{'f' * 64}.json", base / "scans" / "judged" / "j.json",
           base / "scans" / "catalog" / "c.json", base / "plans" / "p.json", base / "facts" / "f.json",
           base / "bundles" / "gate_scan-0123.json"]
    for path in old:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    not_an_entry = base / "facts" / "notes.txt"
    not_an_entry.write_text("mine")
    wheels = base / "sglang" / "0.5.8" / "x.json"
    wheels.parent.mkdir(parents=True)
    wheels.write_text("{}")
    key = memo.key(memo.Kind.PLANS, "inputs")
    assert key is not None

    monkeypatch.setenv("GPUOPS_CACHE", str(base))
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "elsewhere"))  # another root: the old place is not its
    memo.remove_old_layout.cache_clear()
    memo.put(key, {"v": 1})
    assert all(path.exists() for path in old)

    monkeypatch.delenv("GPUOPS_KEEP")
    memo.remove_old_layout.cache_clear()
    memo.put(key, {"v": 1})
    assert memo.get(key) is not None and (base / "kept" / "plans").is_dir()
    assert not any(path.exists() for path in old)
    assert not (base / "scans").exists() and not (base / "plans").exists() and not (base / "bundles").exists()
    assert not_an_entry.read_text() == "mine" and wheels.exists()
