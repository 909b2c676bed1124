"""Rolling changes: hosts in batches (Ansible's ``serial``), stopping when a batch fails too much.

    Rollout.parse("1,10%,50%", 0).batches(hosts)   # 1 host, then 10% of them, then 50% until done

A batch is finished (each host's whole run: change, restart, health) before the next begins. When
more than ``max_fail_percentage`` of a batch failed, the hosts of later batches are not touched and
are reported as skipped. Without a percentage, as in Ansible, only a batch in which every host
failed stops the rollout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpuops.errors import GpuopsError
from gpuops.frozen import frozen

T = TypeVar("T")


class RolloutError(GpuopsError):
    """A --serial or --max-fail-percentage value that cannot be used (bad input: exit 2)."""


@frozen
class BatchSize:
    """One size of a ``--serial`` list: a number of hosts, or a percentage of all of them."""

    count: int | None = None     # a number of hosts
    percent: float | None = None  # or a share of all the hosts (floor, at least 1)

    def of(self, total: int) -> int:
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return max(1, math.floor(total * self.percent / 100.0))


@frozen
class Rollout:
    """How a change rolls out (``--serial``, ``--max-fail-percentage``): the batch sizes in order, the last
    repeating, and the share of a batch's hosts that may fail before the rollout stops."""

    sizes: tuple[BatchSize, ...] = ()   # empty: all hosts in one batch
    max_fail_percentage: float | None = None

    @staticmethod
    def parse(serial: str | None, max_fail_percentage: float | None = None) -> "Rollout | None":
        if serial is None and max_fail_percentage is None:
            return None
        sizes: list[BatchSize] = []
        for part in (serial or "").split(","):
            part = part.strip()
            if not part and serial is None:
                continue
            sizes.append(_size(part, serial or ""))
        if max_fail_percentage is not None and not 0 <= max_fail_percentage <= 100:
            raise RolloutError(f"--max-fail-percentage {max_fail_percentage:g} must be between 0 and 100")
        return Rollout(tuple(sizes), max_fail_percentage)

    def batches(self, hosts: Sequence[T], together: Callable[[T], str | None] | None = None) -> list[list[T]]:
        """The hosts cut into batches, in inventory order; the last size repeats (as in Ansible).

        ``together(host)``: a name shared by hosts that must never be split (the nodes of one
        multi-node deployment, ``sglang_deployment``): a batch that takes one takes them all."""
        total = len(hosts)
        if not self.sizes:
            return [list(hosts)] if hosts else []
        keys = [together(h) if together else None for h in hosts]
        left = list(range(total))  # positions not yet in a batch, in order
        out: list[list[T]] = []
        index = 0
        while left:
            size = self.sizes[min(index, len(self.sizes) - 1)].of(total)
            names = {keys[i] for i in left[:size]} - {None}
            taken = left[:size] + [i for i in left[size:] if keys[i] in names]
            out.append([hosts[i] for i in sorted(taken)])
            left = [i for i in left if i not in set(taken)]
            index += 1
        return out

    def stops_after(self, failed: int, batch_size: int) -> bool:
        """Do `failed` failures in a batch of `batch_size` hosts stop the rollout?"""
        if failed == 0:
            return False
        if self.max_fail_percentage is None:
            return failed == batch_size
        return failed * 100.0 / batch_size > self.max_fail_percentage

    def describe_stop(self, failed: int, batch_size: int, number: int) -> str:
        why = (f"more than {self.max_fail_percentage:g}% (--max-fail-percentage)" if self.max_fail_percentage is not None
               else "all of them")
        return f"not attempted: {failed} of {batch_size} host(s) failed in batch {number}, {why}"


def _size(part: str, serial: str) -> BatchSize:
    text = part[:-1].strip() if part.endswith("%") else part
    try:
        value = float(text) if part.endswith("%") else int(text)
    except ValueError:
        raise RolloutError(f"--serial {serial!r}: {part!r} is not a host count or a percentage (N or N%)") from None
    if part.endswith("%"):
        if not 0 < value <= 100:
            raise RolloutError(f"--serial {serial!r}: {part!r} must be a percentage above 0 and at most 100")
        return BatchSize(percent=value)
    if value < 1:
        raise RolloutError(f"--serial {serial!r}: a batch holds at least 1 host, not {part!r}")
    return BatchSize(count=int(value))


SERIAL_VAR, MAX_FAIL_VAR = "gpuops_serial", "gpuops_max_fail_percentage"


def rollout_for(hosts: Sequence[Any], given: Rollout | None) -> Rollout | None:
    """The command line's rollout, else the inventory's (``gpuops_serial``, ``gpuops_max_fail_percentage``).

    The inventory's values must be the same for every selected host (set them on a group that
    holds them all): one rollout orders one set of hosts.
    """
    if given is not None:
        return given
    found: dict[str, set[str]] = {SERIAL_VAR: set(), MAX_FAIL_VAR: set()}
    for host in hosts:
        for name in found:
            value = (host.vars or {}).get(name)
            found[name].add("" if value is None else str(value))
    for name, values in found.items():
        if len(values) > 1:
            shown = ", ".join(sorted(v or "(unset)" for v in values))
            raise RolloutError(f"{name} differs between the selected hosts ({shown}); set it on a group that holds "
                               f"them all, or give --serial/--max-fail-percentage")
    serial = next(iter(found[SERIAL_VAR])) or None
    max_fail_text = next(iter(found[MAX_FAIL_VAR])) or None
    max_fail: float | None = None
    if max_fail_text is not None:
        try:
            max_fail = float(max_fail_text)
        except ValueError:
            raise RolloutError(f"{MAX_FAIL_VAR} {max_fail_text!r} is not a percentage") from None
    try:
        return Rollout.parse(serial, max_fail)
    except RolloutError as exc:
        raise RolloutError(f"{SERIAL_VAR} (inventory): {exc}") from None
