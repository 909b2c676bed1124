"""`gpuops tune` over speculative decoding on the field box's shape (8x RTX PRO 6000 on PCIe, the
lab's calibrated speed model), against real sshd and the real SGLang 0.5.16 source on the host:
flags checked there first (a typo changes nothing), speculation off measured as the baseline in the
same run, a variant the release refuses at start-up rolled back and reported while the sweep goes
on, and the host byte for byte as it started. One lab for every case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration

# The field box as launched before speculation (the baseline of the field report's 82 tok/s)
FIELD_BOX = ("--model-path", "/models/Kimi-K2.5", "--tp", "8", "--trust-remote-code", "--enable-metrics")
BENCH = ["--num-requests", "2", "--warmup", "0", "--input-len", "16", "--output-len", "24"]


def test_speculation_sweep_on_the_field_box(lab_factory, run_gpuops, tmp_path: Path) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.16", server_args=FIELD_BOX)
    host = lab.hosts[0]
    inventory = ["-i", str(lab.inventory_path)]
    first = run_gpuops("apply", "sglang-service", *inventory, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    before = tree_hashes(host.dir, skip_runs=True)

    # A misspelt flag: refused in one line naming the release's own, before anything changes.
    typo = run_gpuops("tune", *inventory, "--sweep", "speculative_algorithm=NGRAM", "--sweep",
                      "speculative_num_draft_token=4", "--results-dir", str(tmp_path / "typo"))
    assert typo.returncode == 2 and "Traceback" not in typo.stderr
    assert typo.stderr.strip().count("\n") == 0
    assert "SGLang 0.5.16 has no launch flag speculative_num_draft_token (closest: speculative_num_draft_tokens" \
        in typo.stderr
    assert tree_hashes(host.dir, skip_runs=True) == before and not (tmp_path / "typo").exists()

    # NGRAM at 4 and 12 draft tokens, and once over a paged KV cache, which 0.5.16 refuses at start-up.
    proc = run_gpuops("tune", *inventory, "--sweep", "speculative_algorithm=NGRAM",
                      "--sweep", "speculative_num_draft_tokens=4,12", "--sweep", "page_size=1,16", "--one-at-a-time",
                      "--results-dir", str(tmp_path / "results"), "--json", *BENCH, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["speculation_swept"] is True
    rows = {t["variant"]: t for t in doc["hosts"][host.name]["ranking"]}
    base = rows["baseline (as configured)"]
    four = rows["speculative_algorithm=NGRAM speculative_num_draft_tokens=4 page_size=1"]
    twelve = rows["speculative_algorithm=NGRAM speculative_num_draft_tokens=12 page_size=1"]
    paged = rows["speculative_algorithm=NGRAM speculative_num_draft_tokens=4 page_size=16"]
    # the baseline ran without speculation; each NGRAM row says what the server reported
    assert base["speculative"] is False and base["accept_length"] is None
    assert four["speculative"] is True and four["accept_length"] == pytest.approx(1.875, abs=0.01)
    assert twelve["accept_length"] == pytest.approx(2.0, abs=0.01)
    # accepted / proposed drafts, the server's /metrics gauge: 0.875 of 3 drafts, 1.0 of 11
    assert four["accept_rate"] == pytest.approx(0.875 / 3, abs=0.01)
    assert twelve["accept_rate"] == pytest.approx(1 / 11, abs=0.01)
    assert base["accept_rate"] is None
    # simulated, and marked so: the field box's model predicts 82 tok/s plain, NGRAM slower (the
    # verify pass pays the same 122 all-reduces); the verdict against the baseline says by how much
    assert base["simulated"] and base["speed_model"].startswith("rtx-pro-6000-pcie-x8")
    assert base["output_tokens_per_s"] > twelve["output_tokens_per_s"] > four["output_tokens_per_s"]
    assert four["against_baseline"]["ratio"] < 1 and four["against_baseline"]["verdict"] in ("slower", "within noise")
    assert doc["hosts"][host.name]["best"] == "baseline (as configured)"
    # the refused variant: rolled back by its own run, the release's words under its row
    assert paged["status"] == "apply_failed" and "rolled back" in paged["error"]
    assert "ValueError: speculative_eagle_topk(10) > 1 with page_size(16) > 1" in paged["log_tail"]
    assert doc["hosts"][host.name]["ranking"][-1]["variant"] == paged["variant"]

    # One stored result per measured variant, each with its own configuration fingerprint.
    stored = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("*.json")]
    assert len(stored) == 3
    assert len({r["fingerprint"] for r in stored}) == 3
    compare = run_gpuops("results", "compare", "--results-dir", str(tmp_path / "results"),
                         base["result_id"], twelve["result_id"])
    assert compare.returncode == 0, compare.stderr
    report = run_gpuops("report", "--results-dir", str(tmp_path / "results"), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.md").read_text()  # tok/s and accept length per variant, each told apart
    row = next(line for line in page.splitlines() if twelve["result_id"] in line)
    assert "speculative_algorithm=NGRAM" in row and "speculative_num_draft_tokens=12" in row and "2.00" in row

    # The host as it started: every byte, and the server on its original launch.
    assert doc["hosts"][host.name]["restored"] is True
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert server_info(host.server_port)["speculative_algorithm"] is None
