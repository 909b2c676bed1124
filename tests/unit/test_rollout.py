"""--serial batches as Ansible cuts them, and when a failing batch stops the rest."""

from __future__ import annotations

import threading

import pytest

from gpuops.errors import GpuopsError
from gpuops.inventory import load_inventory
from gpuops.transport import run_on_hosts
from gpuops.transport.rollout import Rollout, RolloutError


def sizes(serial: str, total: int) -> list[int]:
    rollout = Rollout.parse(serial)
    assert rollout is not None
    return [len(b) for b in rollout.batches(list(range(total)))]


def test_batch_sizes_like_ansible() -> None:
    assert sizes("1", 3) == [1, 1, 1]
    assert sizes("2", 5) == [2, 2, 1]
    assert sizes("30%", 10) == [3, 3, 3, 1]
    assert sizes("10%", 5) == [1, 1, 1, 1, 1]      # a share rounds down, but a batch holds at least one host
    assert sizes("1,10%,50%", 20) == [1, 2, 10, 7]  # the last size repeats
    assert sizes("100%", 4) == [4]
    assert Rollout.parse(None, None) is None
    assert [len(b) for b in Rollout.parse(None, 0).batches([1, 2, 3])] == [3]  # type: ignore[union-attr]


@pytest.mark.parametrize("serial", ["0", "-1", "x", "0%", "101%", "1,,2", ""])
def test_bad_serial_values_are_refused(serial: str) -> None:
    with pytest.raises(RolloutError) as caught:
        Rollout.parse(serial)
    assert str(caught.value).startswith(f"--serial {serial!r}")


def test_thresholds() -> None:
    assert Rollout.parse("2", 0).stops_after(1, 2)          # type: ignore[union-attr]
    assert not Rollout.parse("2", 50).stops_after(1, 2)     # type: ignore[union-attr]  (50% is not above 50%)
    assert Rollout.parse("3", 50).stops_after(2, 3)         # type: ignore[union-attr]
    assert not Rollout.parse("2").stops_after(1, 2)         # type: ignore[union-attr]  without P: only a wholly failed batch
    assert Rollout.parse("2").stops_after(2, 2)             # type: ignore[union-attr]


def test_batches_run_in_order_and_a_failed_batch_leaves_the_rest_unattempted() -> None:
    hosts = load_inventory("h1,h2,h3,h4,h5").select(None)
    started: list[str] = []
    lock = threading.Lock()

    def work(host) -> str:
        with lock:
            started.append(host.name)
        if host.name == "h3":
            raise GpuopsError(f"{host.name}: broken")
        return "done"

    outcomes = run_on_hosts(hosts, work, forks=8, rollout=Rollout.parse("1,2", 0))
    assert started[0] == "h1" and sorted(started[1:]) == ["h2", "h3"]  # h4, h5 never started
    assert outcomes["h3"].error == "broken" and not outcomes["h3"].skipped
    for name in ("h4", "h5"):
        assert outcomes[name].skipped and not outcomes[name].ok
        assert outcomes[name].error == "not attempted: 1 of 2 host(s) failed in batch 2, more than 0% (--max-fail-percentage)"
    assert list(outcomes) == ["h1", "h2", "h3", "h4", "h5"]


def test_a_value_that_reports_failure_counts_as_failed() -> None:
    hosts = load_inventory("h1,h2").select(None)
    outcomes = run_on_hosts(hosts, lambda h: h.name != "h1", rollout=Rollout.parse("1", 0), failed=lambda ok: not ok)
    assert outcomes["h2"].skipped


def test_the_inventory_may_set_the_rollout_when_the_command_line_does_not(tmp_path) -> None:
    from gpuops.transport.rollout import rollout_for

    path = tmp_path / "inv.yml"
    path.write_text("all:\n  vars: {gpuops_serial: '1,50%', gpuops_max_fail_percentage: 0}\n  hosts: {a: , b: , c: }\n")
    hosts = load_inventory(str(path)).select(None)
    rollout = rollout_for(hosts, None)
    assert rollout is not None and [len(b) for b in rollout.batches(hosts)] == [1, 1, 1]
    assert rollout.max_fail_percentage == 0
    given = Rollout.parse("3")
    assert rollout_for(hosts, given) is given
    path.write_text("all:\n  hosts: {a: {gpuops_serial: 1}, b: }\n")
    with pytest.raises(RolloutError, match="gpuops_serial differs between the selected hosts"):
        rollout_for(load_inventory(str(path)).select(None), None)
    path.write_text("all:\n  hosts: {a: , b: }\n")
    assert rollout_for(load_inventory(str(path)).select(None), None) is None


def test_a_batch_never_splits_a_deployment() -> None:
    """The nodes of one multi-node server (sglang_deployment) go in the batch that takes the first."""
    rollout = Rollout.parse("1")
    assert rollout is not None
    deployment = {"a": "big", "c": "big", "d": "other", "e": "other"}
    batches = rollout.batches(list("abcde"), together=deployment.get)
    assert batches == [["a", "c"], ["b"], ["d", "e"]]
    assert Rollout.parse("2").batches(list("abcde"), together=deployment.get) == [  # type: ignore[union-attr]
        ["a", "b", "c"], ["d", "e"]]
    assert rollout.batches(list("abc")) == [["a"], ["b"], ["c"]]
