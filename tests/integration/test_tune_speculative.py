"""`gpuops tune` over speculative decoding on the field box (8x RTX PRO 6000 on PCIe, the lab's
calibrated speed model, launched with EAGLE-3 as the field report's box was), against real sshd and
the real SGLang 0.5.16 source on the host: flags checked there first (a typo changes nothing),
speculation off measured in the same run as the reference, a variant the release refuses at start-up
rolled back and reported while the sweep goes on, and the host byte for byte as it started. One lab
for every case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration

# The field box as the lab describes it (gpus/rtx-pro-6000-x8.yaml: EAGLE-3, 3 steps, 4 draft tokens),
# with /metrics on (the acceptance rate is SGLang's gauge there)
FIELD_BOX = ("--model-path", "/models/Kimi-K2.5", "--tp", "8", "--trust-remote-code", "--speculative-algorithm",
             "EAGLE3", "--speculative-draft-model-path", "/models/Kimi-K2.5-eagle3", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--enable-metrics")
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
    eagle = rows["baseline (as configured)"]
    off = rows["speculation off"]
    four = rows["speculative_algorithm=NGRAM speculative_num_draft_tokens=4 page_size=1"]
    twelve = rows["speculative_algorithm=NGRAM speculative_num_draft_tokens=12 page_size=1"]
    paged = rows["speculative_algorithm=NGRAM speculative_num_draft_tokens=4 page_size=16"]
    # speculation off: the configured EAGLE-3 flags taken out for that run, measured as the reference
    off_variant = next(v for v in doc["variants"] if v["label"] == "speculation off")
    assert off_variant["drop"] == ["--speculative-algorithm", "--speculative-draft-model-path",
                                   "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                                   "--speculative-num-steps"]
    assert off["speculative"] is False and off["accept_length"] is None and off["accept_rate"] is None
    assert off["against_baseline"] == {"verdict": "reference", "ratio": 1.0}
    # each speculating row says what the server reported: tokens per verify step, accepted / proposed
    assert eagle["speculative"] is True and eagle["accept_length"] == pytest.approx(1.856, abs=0.01)
    assert four["accept_length"] == pytest.approx(1.875, abs=0.01)
    assert twelve["accept_length"] == pytest.approx(2.0, abs=0.01)
    assert four["accept_rate"] == pytest.approx(0.875 / 3, abs=0.01)
    assert twelve["accept_rate"] == pytest.approx(1 / 11, abs=0.01)
    # simulated, and marked so: the field box's model predicts the report's 60 tok/s for EAGLE-3 and
    # 82 without speculation; NGRAM pays the same 122 all-reduces per verify pass and loses too
    assert eagle["simulated"] and eagle["speed_model"].startswith("rtx-pro-6000-pcie-x8")
    assert eagle["output_tokens_per_s"] == pytest.approx(60, rel=0.05)
    assert off["output_tokens_per_s"] == pytest.approx(82, rel=0.05)
    assert off["output_tokens_per_s"] > twelve["output_tokens_per_s"] > four["output_tokens_per_s"]
    assert eagle["against_baseline"]["verdict"] == "slower" and eagle["against_baseline"]["ratio"] < 0.8
    assert doc["hosts"][host.name]["best"] == "speculation off"  # the field's answer, as a prediction
    # the refused variant: rolled back by its own run, the release's words under its row
    assert paged["status"] == "apply_failed" and "rolled back" in paged["error"]
    assert "ValueError: speculative_eagle_topk(10) > 1 with page_size(16) > 1" in paged["log_tail"]
    assert doc["hosts"][host.name]["ranking"][-1]["variant"] == paged["variant"]

    # One stored result per measured variant, each with its own configuration fingerprint.
    stored = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("*.json")]
    assert len(stored) == 4
    assert len({r["fingerprint"] for r in stored}) == 4
    compare = run_gpuops("results", "compare", "--results-dir", str(tmp_path / "results"),
                         off["result_id"], twelve["result_id"])
    assert compare.returncode == 0, compare.stderr
    report = run_gpuops("report", "--results-dir", str(tmp_path / "results"), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.md").read_text()  # tok/s and accept length per variant, each told apart
    row = next(line for line in page.splitlines() if twelve["result_id"] in line)
    assert "speculative_algorithm=NGRAM" in row and "speculative_num_draft_tokens=12" in row and "2.00" in row

    # The host as it started: every byte, and the server on its original launch.
    assert doc["hosts"][host.name]["restored"] is True
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert server_info(host.server_port)["speculative_algorithm"] == "EAGLE3"
