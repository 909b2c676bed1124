"""gpuops.prefetch: work done in the background, joined before use, failures left to the caller."""

from __future__ import annotations

import threading
import time

import pytest

from gpuops import prefetch as prefetch_mod


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch_mod, "_STARTED", {})


def test_works_in_the_background_and_join_waits() -> None:
    done: list[str] = []

    def slow() -> None:
        time.sleep(0.05)
        done.append(threading.current_thread().name)

    handle = prefetch_mod.prefetch(slow)
    handle.join()
    assert done == ["gpuops-prefetch"]
    assert handle.thread is not None and not handle.thread.is_alive()


def test_failing_work_is_left_to_the_callers_own_call() -> None:
    ran: list[str] = []

    def broken() -> None:
        raise ValueError("broken on purpose")

    prefetch_mod.prefetch(broken, lambda: ran.append("after")).join()  # no exception here
    assert ran == []  # the work after a failure is left to the caller too


def test_same_work_shares_one_prefetch_and_no_work_starts_no_thread() -> None:
    calls: list[int] = []

    def once() -> None:
        calls.append(1)

    first = prefetch_mod.prefetch(once)
    assert prefetch_mod.prefetch(once) is first
    first.join()
    assert calls == [1]
    assert prefetch_mod.prefetch().thread is None
