"""The fault matrix of test_apply_faults for fusion-sm120 (two steps on the host: the gate audit,
then the verdict): whatever dies at each phase, the lab host ends exactly as it was, every patched
byte back, and the next apply works.

Its own module (issue 39): under ``--dist loadfile`` a module runs whole on one worker, and the
fault matrix in one file was the run's longest tail (288 s alone at load 11-15); its fusion half
needs a lab of its own (SGLang 0.5.8's real source, FlashInfer 0.6.17) anyway, so it runs beside
the nccl-env half on another worker. The faults, the kills and what is asserted are the same
helpers (test_apply_faults' docstring says what each kill stands for).
"""

from __future__ import annotations

import json

import pytest
from labtools import FUSION_FLASHINFER
from test_apply_faults import calls, client, fingerprint, journal_events, kill, lab_args, paused, server_view, wait_host_settled

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fusion_lab(lab_factory):
    return lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.8", flashinfer=FUSION_FLASHINFER)


FUSION_CELLS = [("client", "compile"), ("client", "verdict"), ("sshd", "server_start"), ("worker", "audit"),
                ("worker", "health")]


@pytest.mark.parametrize("what, phase", FUSION_CELLS, ids=[f"{w}@{p}" for w, p in FUSION_CELLS])
def test_fusion_fault(fusion_lab, what: str, phase: str, run_gpuops, gpuops_home) -> None:
    host = fusion_lab.hosts[0]
    before, served = fingerprint(host.dir), server_view(host)
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 60}))
    earlier = calls(host)
    proc = client(fusion_lab, "fusion-sm120", *lab_args("fusion-sm120", 1)[:6], "-e", "fusion_allow_without_p2p=true", home=gpuops_home)
    where = paused(host, phase, proc, earlier)
    kill(what, where, proc)
    proc.communicate(timeout=120)
    wait_host_settled(host, where)
    assert fingerprint(host.dir) == before  # the gates closed again, every patched byte back
    assert server_view(host) == served  # the previous server: same flags, same environment
    assert journal_events(host)[-1][1] == "rolled_back"


def test_fusion_next_apply_works_after_the_faults(fusion_lab, run_gpuops, gpuops_home) -> None:
    host = fusion_lab.hosts[0]
    before = fingerprint(host.dir)
    # The default lease, not the faults' 4 s: this apply is not a fault, and under a whole run's
    # load a patch's scan once kept the host silent past 4 s ("the host went silent for 5 s").
    proc = run_gpuops("apply", "fusion-sm120", "-i", str(fusion_lab.inventory_path), "--json",
                      *lab_args("fusion-sm120", 1)[2:6], "-e", "fusion_allow_without_p2p=true", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["hosts"]["h01"]["status"] == "finished"
    undo = run_gpuops("rollback", "-i", str(fusion_lab.inventory_path), timeout=300)
    assert undo.returncode == 0, undo.stdout + undo.stderr
    assert fingerprint(host.dir) == before
