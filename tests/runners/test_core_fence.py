"""The core fence (runners.audit.sample.CoreFence): while the parent holds the measurement core,
nothing else runs there, so no worker can start on a call's values before it is announced."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from runners.audit.sample import CoreFence


def _spin(counter, core: int) -> None:
    os.sched_setaffinity(0, [core])
    while True:
        counter.value += 1


def _advances(counter, seconds: float) -> int:
    before = counter.value
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return counter.value - before


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or os.geteuid() != 0,
                    reason="needs two cores and the right to use SCHED_FIFO (root), as CI has")
def test_nothing_runs_on_the_measurement_core_while_the_parent_holds_it():
    cores = sorted(os.sched_getaffinity(0))
    core, home = cores[-1], [c for c in cores if c != cores[-1]]
    counter = multiprocessing.get_context("fork").Value("Q", 0, lock=False)
    spinner = multiprocessing.get_context("fork").Process(target=_spin, args=(counter, core), daemon=True)
    pinned = os.sched_getaffinity(0)
    spinner.start()
    try:
        os.sched_setaffinity(0, home)
        deadline = time.monotonic() + 10
        while counter.value == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counter.value > 0, "the spinner never ran"
        fence = CoreFence(core, home)
        assert fence.enter()
        try:
            assert os.sched_getaffinity(0) == {core}
            held = _advances(counter, 0.02)
        finally:
            fence.leave()
        assert held == 0, f"the spinner counted {held} times on the held core"
        assert os.sched_getaffinity(0) == set(home) and os.sched_getscheduler(0) == os.SCHED_OTHER
        assert fence.held_ns >= 20_000_000
        assert _advances(counter, 0.02) > 0, "the spinner did not resume once the core was left"
    finally:
        spinner.kill()
        spinner.join(5)
        os.sched_setaffinity(0, pinned)


def test_without_the_right_to_real_time_it_holds_nothing(monkeypatch):
    """An unprivileged harness: enter says False and the parent's mask is left as it was."""

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    before = os.sched_getaffinity(0)
    fence = CoreFence(max(before), sorted(before))
    assert fence.enter() is False
    assert os.sched_getaffinity(0) == before
