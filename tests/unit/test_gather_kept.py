"""Probes the host may skip (gather.Probe ``setup`` / ``unless``): what is skipped really does not run,
what is not skipped runs as before, and only a probe that asked to be skippable can come back "kept"."""

from __future__ import annotations

from pathlib import Path

from gpuops.gather import KEPT, Probe, ProbeFailure, ProbeKept, ProbeOutput, gather, parse_outputs, split_gather_output
from gpuops.inventory import Host
from gpuops.transport.local import LocalConnection


def _local() -> LocalConnection:
    return LocalConnection(Host(name="localhost", address=None, port=None, user=None, key_file=None,
                                connection="local", groups=(), vars={}))


def raw(out: ProbeOutput) -> ProbeOutput:
    return out


def test_a_probe_whose_condition_holds_is_not_run_and_comes_back_kept(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    started = tmp_path / "started"
    setup = "gpuops_t_fp=abc"
    values = gather(_local(), [
        Probe("skipped", f"echo ran >> {ran}; echo out", raw, start=f"echo s >> {started}", setup=setup,
              unless='[ "$gpuops_t_fp" = abc ]'),
        Probe("runs", f"echo ran2 >> {ran}; echo $gpuops_t_fp", raw, setup=setup, unless='[ "$gpuops_t_fp" = other ]'),
        Probe("plain", 'printf "%s" "${gpuops_t_fp:-unset}"', raw),
    ])
    assert values["skipped"] == ProbeKept("skipped")
    assert values["runs"] == ProbeOutput("abc\n", "", 0)  # probes run in subshells that see setup's variables
    assert values["plain"] == ProbeOutput("abc", "", 0)
    assert ran.read_text() == "ran2\n"  # the skipped probe's script never ran
    assert not started.exists()  # nor its background start


def test_each_setup_runs_once_before_any_start(tmp_path: Path) -> None:
    log = tmp_path / "log"
    setup = f"echo setup >> {log}"
    gather(_local(), [
        Probe("a", "true", raw, setup=setup, start=f"echo start-a >> {log}"),
        Probe("b", "true", raw, setup=setup),
        Probe("c", "true", raw, setup=f"echo other-setup >> {log}"),
    ])
    lines = log.read_text().splitlines()
    assert lines[:2] == ["setup", "other-setup"] and lines.count("setup") == 1 and lines[2:] == ["start-a"]


def test_a_started_probe_that_is_not_skipped_still_waits_for_its_start(tmp_path: Path) -> None:
    values = gather(_local(), [
        Probe("slow", 'cat "$gpuops_tmp/slow.out"', raw, start='sleep 0.2; echo done > "$gpuops_tmp/slow.out"',
              unless="false"),
    ])
    assert values["slow"] == ProbeOutput("done\n", "", 0)


def test_kept_for_a_probe_that_cannot_be_kept_is_a_failure() -> None:
    """A frame saying "kept" for a probe without ``unless`` (a confused or hostile script): no value."""
    nonce = "0123456789abcdef"
    stdout = f"\n@@gpuops:{nonce} kept a\n"
    outputs = split_gather_output(stdout, nonce)
    assert outputs == {"a": KEPT}
    values = parse_outputs([Probe("a", "true", raw), Probe("b", "true", raw, unless="true")], outputs)
    assert isinstance(values["a"], ProbeFailure) and "cannot be kept" in values["a"].reason
    assert isinstance(values["b"], ProbeFailure)  # never came back at all


def test_a_probe_cannot_forge_a_kept_frame_for_another() -> None:
    """Output that merely looks like a kept frame (another nonce, or inside a probe's own frame) is data."""
    values = gather(_local(), [
        Probe("liar", "printf '\\n@@gpuops:0000000000000000 kept victim\\n'", raw),
        Probe("victim", "echo real", raw, unless="false"),
    ])
    assert values["victim"] == ProbeOutput("real\n", "", 0)
    assert "kept victim" in values["liar"].stdout


def test_an_empty_real_output_is_not_kept() -> None:
    assert ProbeOutput("", "", 0) != KEPT
    values = gather(_local(), [Probe("quiet", "true", raw, unless="false")])
    assert values["quiet"] == ProbeOutput("", "", 0) and not values["quiet"].kept
