"""A function on hostile input runs in a forked child under time, CPU and memory limits."""

from __future__ import annotations

import os
import time

import pytest

from catalog.bounded import BoundedFailure, run_bounded


def test_it_returns_the_childs_value_and_leaves_the_parent_untouched():
    state = {"touched": False}

    def work():
        state["touched"] = True
        return {"pid": os.getpid(), "sum": sum(range(1000))}

    value = run_bounded(work, wall_seconds=10, cpu_seconds=10, memory_bytes=256 << 20)
    assert value["sum"] == 499500 and value["pid"] != os.getpid()
    assert state == {"touched": False}  # it ran in another process


def test_it_stops_a_child_that_outlasts_its_deadline():
    started = time.monotonic()
    with pytest.raises(BoundedFailure) as caught:
        run_bounded(lambda: time.sleep(60), wall_seconds=0.5, cpu_seconds=10, memory_bytes=256 << 20)
    assert caught.value.kind == "time" and time.monotonic() - started < 5


def test_it_stops_a_child_that_burns_cpu_past_its_limit():
    def spin():
        while True:
            pass

    with pytest.raises(BoundedFailure) as caught:
        run_bounded(spin, wall_seconds=30, cpu_seconds=1, memory_bytes=256 << 20)
    assert caught.value.kind == "time"


def test_it_refuses_a_child_more_memory_than_allowed():
    with pytest.raises(BoundedFailure) as caught:
        run_bounded(lambda: len(bytearray(1 << 30)), wall_seconds=30, cpu_seconds=10, memory_bytes=128 << 20)
    assert caught.value.kind == "memory"


def test_it_reports_an_exception_by_its_type_only():
    def fail():
        raise ValueError("/srv/secret/path is not allowed")

    with pytest.raises(BoundedFailure) as caught:
        run_bounded(fail, wall_seconds=10, cpu_seconds=10, memory_bytes=256 << 20)
    assert caught.value.kind == "error" and caught.value.detail == "ValueError"
