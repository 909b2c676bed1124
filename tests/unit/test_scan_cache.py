"""Gate scans kept on the client (gates/scan_cache.py) with the probe that offers them (gates/probe.py),
run as a host runs the probe: its sh script under ``sh``, the real scanner, ``$GPUOPS_PY`` set."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops import memo
from gpuops.gates import scan_cache
from gpuops.gates.probe import gate_scan_probe
from gpuops.gates.scan import GateScan
from gpuops.gather import ProbeOutput
from gpuops.inventory.model import Host

GATED = "from sglang.srt.utils import is_sm90_supported\n\ndef apply_allreduce_fusion():\n    if is_sm90_supported():\n        return True\n    return False\n"


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "scans"
    monkeypatch.setenv("GPUOPS_KEEP", str(where))
    return where


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt" / "utils").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "utils" / "__init__.py").write_text("def is_sm90_supported():\n    return False\n")
    (pkg / "srt" / "communicator.py").write_text(GATED)
    return pkg.parent


HOST = Host(name="h01", address="127.0.0.1", port=2222, user="root", key_file=None, connection="ssh", groups=("all",))


def run_probe(site: Path, with_sources: bool = False, host: Host | None = HOST) -> GateScan:
    probe = gate_scan_probe(with_sources=with_sources, host=host)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(GPUOPS_PY=sys.executable, PYTHONPATH=str(site))
    done = subprocess.run(["sh", "-s"], input=probe.script, capture_output=True, text=True, env=env, timeout=120, cwd="/")
    return probe.parse(ProbeOutput(done.stdout, done.stderr, done.returncode))


def entries(cache_dir: Path) -> list[Path]:
    """The kept scans (one scope per host), not the other memos kept beside them."""
    return sorted(cache_dir.glob("scans/*/*.json"))


def test_second_scan_of_an_unchanged_tree_is_the_kept_one(site: Path, cache_dir: Path) -> None:
    first = run_probe(site)
    assert first.known and not first.cached and first.fingerprint
    assert [g["file"] for g in first.gates] == ["srt/communicator.py"]
    assert [p.stem for p in entries(cache_dir)] == [first.fingerprint]
    second = run_probe(site)
    assert second.cached and second.known
    assert second.fingerprint == first.fingerprint
    assert second.gates == first.gates and second.predicates == first.predicates and second.root == first.root


def test_a_changed_file_is_scanned_again(site: Path, cache_dir: Path) -> None:
    first = run_probe(site)
    path = site / "sglang" / "srt" / "communicator.py"
    path.write_text(GATED.replace("if is_sm90_supported():", "if is_sm90_supported() or is_sm100_supported():"))
    second = run_probe(site)
    assert not second.cached and second.fingerprint != first.fingerprint
    assert "is_sm100_supported()" in second.gates[0]["text"]
    assert run_probe(site).cached  # and that new scan is the one kept


def test_corrupt_entry_is_ignored_and_replaced(site: Path, cache_dir: Path) -> None:
    first = run_probe(site)
    (entry,) = entries(cache_dir)
    entry.write_text(entry.read_text()[:500])  # torn
    again = run_probe(site)
    assert not again.cached and again.known and again.gates == first.gates
    assert json.loads(entry.read_text())["fingerprint"] == first.fingerprint  # whole again
    assert run_probe(site).cached


def test_entry_whose_content_is_another_scan_is_not_trusted(site: Path, cache_dir: Path) -> None:
    first = run_probe(site)
    (entry,) = entries(cache_dir)
    data = json.loads(entry.read_text())
    for forged in ({**data, "fingerprint": "0" * 64},                                  # header disagrees with the name
                   {**data, "scan": {**data["scan"], "fingerprint": "0" * 64}},        # the scan disagrees
                   {**data, "scan": {**data["scan"], "gates": None}},                  # not a whole scan
                   {**data, "format": 99}):
        entry.write_text(json.dumps(forged))
        assert not scan_cache.for_host(HOST).offer(need_sources=False)  # type: ignore[union-attr]
        assert not run_probe(site).cached
        assert first.fingerprint is not None
    # A kept scan of another tree, renamed to this tree's fingerprint, is not this tree's scan.
    other = {**data, "fingerprint": "f" * 64, "scan": {**data["scan"], "fingerprint": "f" * 64}}
    entry.write_text(json.dumps(other))
    assert not scan_cache.for_host(HOST).offer(need_sources=False)  # type: ignore[union-attr]


def test_unchanged_answer_for_a_scan_never_offered_is_unknown(cache_dir: Path) -> None:
    probe = gate_scan_probe(host=HOST)
    line = json.dumps({"scanner": 1, "ok": True, "unchanged": True, "fingerprint": "e" * 64, "root": "/x"})
    scan = probe.parse(ProbeOutput(line + "\n", "", 0))
    assert not scan.known and "does not hold" in (scan.reason or "")


def test_a_scan_kept_for_inspect_carries_its_sources_and_serves_apply(site: Path, cache_dir: Path) -> None:
    """inspect/advise ask a scan that will be kept with the sources and judge it without them; the
    next apply (which needs them) then uses it. A kept scan without sources (an older gpuops') serves
    a request without sources, never one with."""
    plain = run_probe(site)
    assert not plain.cached and not plain.sources  # handed over without: judged as before
    (entry,) = entries(cache_dir)
    data = json.loads(entry.read_text())
    assert data["has_sources"] is True and "srt/communicator.py" in data["scan"]["sources"]
    with_sources = run_probe(site, with_sources=True)  # apply right after inspect: the kept scan
    assert with_sources.cached and "srt/communicator.py" in with_sources.sources
    served = run_probe(site)
    assert served.cached and not served.sources and served.gates == plain.gates
    data["has_sources"] = False
    del data["scan"]["sources"]
    entry.write_text(json.dumps(data))
    assert run_probe(site).cached
    again = run_probe(site, with_sources=True)
    assert not again.cached and "srt/communicator.py" in again.sources


def test_no_host_or_cache_off_means_a_full_scan_every_time(site: Path, cache_dir: Path, monkeypatch) -> None:
    assert not run_probe(site, host=None).cached
    assert entries(cache_dir) == []
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    assert scan_cache.for_host(HOST) is None
    assert not run_probe(site).cached and not run_probe(site).cached


OTHER = Host(name="h02", address="127.0.0.1", port=2223, user="root", key_file=None, connection="ssh", groups=("all",))


def linked_site(site: Path, target: Path) -> Path:
    """``site`` again under ``target``, every file a hard link (as the lab lays out its hosts, and
    as uv installs from its cache)."""
    for path in sorted(site.rglob("*")):
        dest = target / path.relative_to(site)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            os.link(path, dest)
    return target


def test_a_new_host_with_the_same_files_uses_another_hosts_scan(site: Path, cache_dir: Path, tmp_path: Path) -> None:
    """The lab's hosts (and a fleet cloned from one image) hold the same tree: scanned once between
    them. The scan is kept for the new host too, with its own root, which a patch is written under."""
    first = run_probe(site)
    other_site = linked_site(site, tmp_path / "h02" / "site")
    second = run_probe(other_site, host=OTHER)
    assert second.cached and second.fingerprint == first.fingerprint and second.gates == first.gates
    assert second.root == str(other_site / "sglang") != first.root
    own = [p for p in entries(cache_dir) if p.parent.name == memo.host_identity(OTHER)]
    assert [p.stem for p in own] == [first.fingerprint]
    assert json.loads(own[0].read_text())["scan"]["root"] == second.root
    again = run_probe(other_site, host=OTHER)
    assert again.cached and again.root == second.root
    assert run_probe(site).root == first.root  # the first host's scan keeps its root


def test_a_copy_of_the_tree_is_scanned_and_own_scans_come_first(site: Path, cache_dir: Path, tmp_path: Path) -> None:
    run_probe(site)
    copy = tmp_path / "h02" / "site"
    shutil.copytree(site, copy, copy_function=shutil.copy2)  # same sizes and mtimes, new inodes
    scanned = run_probe(copy, host=OTHER)
    assert not scanned.cached and scanned.known
    offer = scan_cache.for_host(OTHER).offer(need_sources=False)  # type: ignore[union-attr]
    assert list(offer.own) == [scanned.fingerprint] and scanned.fingerprint not in offer.others  # its own, read


def test_other_hosts_scans_are_offered_unread_and_only_the_named_one_is_read(site: Path, cache_dir: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet's hosts share fingerprints: a new host is offered each tree once, by name, before
    anything is read; only the scan its host names is read, once. Scans of other trees kept since
    (a busy fleet, or the suite's labs of four releases) do not push the shared tree out of the offer."""
    for index in range(4):
        host = dataclasses.replace(OTHER, name=f"n{index}", port=3000 + index)
        run_probe(linked_site(site, tmp_path / f"n{index}" / "site"), host=host)
    for index in range(3 * memo.Kind.SCANS.max_entries):  # newer scans of other trees, on other hosts
        other_tree = tmp_path / f"t{index}" / "site"
        shutil.copytree(site, other_tree)
        run_probe(other_tree, host=dataclasses.replace(OTHER, name=f"t{index}", port=4000 + index))
    assert len(entries(cache_dir)) == 4 + 3 * memo.Kind.SCANS.max_entries
    reads: list[memo.Key] = []
    real_get = memo.get
    monkeypatch.setattr(memo, "get", lambda key: reads.append(key) or real_get(key))
    offer = scan_cache.for_host(HOST).offer(need_sources=False)  # type: ignore[union-attr]
    assert len(offer.fingerprints()) == 1 + 3 * memo.Kind.SCANS.max_entries and reads == []
    scan = run_probe(site)
    assert scan.cached and [key.digest for key in reads if key.kind is memo.Kind.SCANS] == [scan.fingerprint]


def test_another_hosts_entry_that_proves_unusable_is_removed_never_used(site: Path, cache_dir: Path,
                                                                        tmp_path: Path) -> None:
    """Another host's entry is read only after the host named it: a torn one then gives an unknown
    scan that says to run again (no gates from it), and is removed, so the next run scans."""
    first = run_probe(site, host=OTHER)
    (entry,) = entries(cache_dir)
    entry.write_text(entry.read_text()[:500])  # torn
    other_site = linked_site(site, tmp_path / "h01" / "site")
    broken = run_probe(other_site)
    assert not broken.known and "run the command again" in (broken.reason or "") and not broken.gates
    assert not entry.exists()
    again = run_probe(other_site)
    assert again.known and not again.cached and again.gates == first.gates
    assert run_probe(other_site).cached


def test_an_offered_entry_pruned_before_the_answer_is_read_from_another_host(site: Path, cache_dir: Path,
                                                                             tmp_path: Path) -> None:
    """Other hosts' entries are offered unread, and a host keeps only its newest few: one offered
    may be pruned by another command before this host answers. Another host's copy of the same
    tree's scan serves; with none left, the scan is unknown ("run again"), never wrong."""
    third = dataclasses.replace(OTHER, name="h03", port=2224)
    first = run_probe(site, host=OTHER)
    assert run_probe(linked_site(site, tmp_path / "h03" / "site"), host=third).cached  # kept for h03 too
    own_site = linked_site(site, tmp_path / "h01" / "site")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(GPUOPS_PY=sys.executable, PYTHONPATH=str(own_site))
    for round_ in (1, 2):
        probe = gate_scan_probe(host=HOST)  # offers, unread, one host's entry of the tree
        offered = scan_cache.for_host(HOST).offer(need_sources=False).others[first.fingerprint]  # type: ignore[union-attr,index]
        gone = [p for p in entries(cache_dir) if p.stem == first.fingerprint
                and (p.parent.name == offered.scope or round_ == 2)]
        assert gone and all(p.parent.name != memo.host_identity(HOST) for p in gone)
        for path in gone:
            path.unlink()  # pruned meanwhile (round 2: every copy)
        done = subprocess.run(["sh", "-s"], input=probe.script, capture_output=True, text=True, env=env, timeout=120)
        scan = probe.parse(ProbeOutput(done.stdout, done.stderr, done.returncode))
        if round_ == 1:
            assert scan.cached and scan.gates == first.gates  # the other host's copy
            for path in entries(cache_dir):
                if path.parent.name == memo.host_identity(HOST):
                    path.unlink()  # h01 forgets it again, for the second round
        else:
            assert not scan.known and "run the command again" in (scan.reason or "")


def test_an_entry_of_another_memo_format_is_never_named(site: Path, cache_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo's format is part of the fingerprint, so a host never names an entry a gpuops with
    another format kept (other hosts' entries are offered unread)."""
    first = run_probe(site, host=OTHER)
    monkeypatch.setattr(memo, "FORMAT", memo.FORMAT + 1)
    scan = run_probe(linked_site(site, tmp_path / "h01" / "site"))
    assert scan.known and not scan.cached and scan.fingerprint != first.fingerprint


def test_hosts_keep_their_own_scans_and_old_entries_are_pruned(site: Path, cache_dir: Path) -> None:
    run_probe(site)
    assert run_probe(site, host=OTHER).cached  # the same tree: the scan is now kept for h02 as well
    path = site / "sglang" / "srt" / "communicator.py"
    for index in range(memo.Kind.SCANS.max_entries + 2):
        path.write_text(GATED + "\n" * (index + 1))
        run_probe(site)
    kept = [p for p in entries(cache_dir) if p.parent.name == memo.host_identity(HOST)]
    assert len(kept) == memo.Kind.SCANS.max_entries
    assert not list(cache_dir.glob("*/.scan-*"))  # no temp files left behind


def test_the_small_check_answers_a_kept_tree_and_the_scanner_never_starts(site: Path, cache_dir: Path) -> None:
    from gpuops.remote import gate_scan, scan_fingerprint

    # One source: gate_scan takes the version from scan_fingerprint and never assigns its own copy
    # (``is`` alone would pass for two copies of a small int).
    assert gate_scan.SCANNER_VERSION is scan_fingerprint.SCANNER_VERSION
    assert "SCANNER_VERSION =" not in inspect.getsource(gate_scan)
    first = run_probe(site)
    probe = gate_scan_probe(host=HOST)
    assert "GPUOPS_SCAN_CHECK_EOF" in probe.script  # offered: the check comes first
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(GPUOPS_PY=sys.executable, PYTHONPATH=str(site))
    done = subprocess.run(["sh", "-s"], input=probe.script, capture_output=True, text=True, env=env, timeout=120, cwd="/")
    answer = json.loads(done.stdout)
    assert answer["unchanged"] and answer["answered_by"] == "fingerprint check" and answer["fingerprint"] == first.fingerprint
    assert done.stderr == ""
    # Nothing offered (no host): no check in the script, the scanner runs.
    assert "GPUOPS_SCAN_CHECK_EOF" not in gate_scan_probe().script


def _rendered(report) -> str:
    import io

    from gpuops.gates.report import render_gate_detail, render_gate_summary
    from gpuops.output import make_console

    out = io.StringIO()
    console = make_console(out, force_terminal=False)
    render_gate_summary(report, console)
    render_gate_detail(report, console, show_all=True)
    return out.getvalue()


def test_verdicts_of_a_kept_scan_are_recalled_only_for_the_same_facts(site: Path, cache_dir: Path) -> None:
    """gates/judge_memo.py: the same kept scan and facts give the kept report (the same JSON and the
    same text); another GPU, CUDA, server or tree is judged."""
    from gpuops.gates.evaluate import judge
    from gpuops.gates.judge_memo import judge_or_recall

    scan = run_probe(site)
    calls = []

    def judged(cc: str = "12.0", cuda: str = "12.8", server: dict | None = None, which=scan):
        def real():
            calls.append(cc)
            return judge(which, cc, cuda, server, interconnect={"nvlink": False})
        return judge_or_recall(which, cc, cuda, server, {"nvlink": False}, real, host="h01")

    first = judged()
    second = judged()
    assert len(calls) == 1
    assert second.to_json() == first.to_json() and json.dumps(second.to_json()) == json.dumps(first.to_json())
    assert _rendered(second) == _rendered(first)
    judged(cc="9.0")
    judged(cuda="13.0")
    judged(server={"args": {"--enable-flashinfer-allreduce-fusion": True}})
    assert len(calls) == 4
    unpinned = dataclasses.replace(scan, fingerprint=None)
    judged(which=unpinned)
    judged(which=unpinned)
    assert len(calls) == 6  # no fingerprint: never kept
    for entry in (cache_dir / "judged").glob("*.json"):
        entry.write_text("{")  # torn
    judged()
    assert len(calls) == 7



@pytest.mark.parametrize("field", __import__("gpuops.gates.judge_memo", fromlist=["x"]).SERVER_FIELDS_NOT_JUDGED)
def test_server_fields_left_out_of_the_verdict_digest_are_not_read_by_the_judge(site: Path, cache_dir: Path,
                                                                                 field: str) -> None:
    """judge_memo leaves these server facts out of its key: a judge that reads one would be served a
    stale kept report, so judging with different values of each must give the same report."""
    from gpuops.gates.evaluate import judge

    scan = run_probe(site)
    base = {"running": True, "args": {"--enable-flashinfer-allreduce-fusion": True}, "architecture": "LlamaForCausalLM",
            "gpu_name": "NVIDIA RTX PRO 6000"}
    reports = [dataclasses.asdict(judge(scan, "12.0", "12.8", {**base, field: value}, interconnect={"nvlink": False}))
               for value in ([], [{"pid": 4242, "port": 30001}], None, "text")]
    assert all(r == reports[0] for r in reports)
