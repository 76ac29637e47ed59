"""Per-stage time limits: the clock that enforces them inside a run's process, and their setting."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.core.exceptions import ImproperlyConfigured

from dyno.env import env_time_limits
from runs.limits import StageClock

DEFAULTS = {"profile": (600, 660), "optimize": (2400, 2520), "audit": (2400, 2520), "store": (300, 360)}


def _spin(seconds: float) -> None:
    """Busy Python code, which the alarm interrupts wherever it is."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _clock(limits, **kwargs) -> StageClock:
    kwargs.setdefault("on_hard", lambda stage, seconds: None)
    kwargs.setdefault("kill", lambda: None)
    return StageClock(limits, **kwargs)


def test_a_stage_past_its_soft_limit_raises_and_the_clock_names_it():
    with _clock({"profile": (5, 60), "optimize": (0.3, 60)}) as clock:
        clock.enter("profile")
        started = time.monotonic()
        with pytest.raises(SoftTimeLimitExceeded):
            clock.enter("optimize")
            _spin(5)
        assert 0.25 < time.monotonic() - started < 3
    assert clock.expired == ("optimize", 0.3)


def test_entering_a_new_stage_restarts_the_clock_and_reentering_the_same_one_does_not():
    with _clock({"profile": (0.6, 60), "optimize": (0.6, 60)}) as clock:
        clock.enter("profile")
        _spin(0.4)
        clock.enter("optimize")  # a fresh 0.6 s: 0.8 s in all passes without a limit
        _spin(0.4)
        assert clock.expired is None
        with pytest.raises(SoftTimeLimitExceeded):
            clock.enter("optimize")  # no restart: the limit falls 0.2 s later
            _spin(5)
    assert clock.expired == ("optimize", 0.6)


def test_restart_counts_the_current_stage_from_now():
    """A runner's calibration inside a run's first stage is not the run's time."""
    with _clock({"profile": (0.6, 60)}) as clock:
        clock.enter("profile")
        _spin(0.4)
        clock.restart()  # a fresh 0.6 s: 0.8 s in all passes without a limit
        _spin(0.4)
        assert clock.expired is None and clock.stage == "profile"
        with pytest.raises(SoftTimeLimitExceeded):
            _spin(0.5)
    assert clock.expired == ("profile", 0.6)


def test_check_raises_for_a_thread_that_gets_no_signal():
    raised: list[BaseException] = []

    def work() -> None:
        with _clock({"audit": (0.2, 60)}) as clock:
            clock.enter("audit")
            time.sleep(0.3)
            try:
                clock.check()
            except SoftTimeLimitExceeded as exc:
                raised.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(10)
    assert len(raised) == 1 and "stage audit" in str(raised[0])


def test_past_the_hard_limit_the_watchdog_records_the_failure_then_kills():
    events: list[object] = []
    with _clock({"audit": (30, 0.3)}, poll_s=0.05, on_hard=lambda stage, seconds: events.append((stage, seconds)),
                kill=lambda: events.append("kill")) as clock:
        clock.enter("audit")
        deadline = time.monotonic() + 5
        while "kill" not in events and time.monotonic() < deadline:
            time.sleep(0.05)  # a native call that never returns to the interpreter, as far as the alarm knows
    assert events == [("audit", 0.3), "kill"]


def test_a_run_that_ends_in_time_is_never_killed_and_its_alarm_is_disarmed():
    events: list[object] = []
    previous = signal.getsignal(signal.SIGALRM)
    with _clock({"store": (0.3, 0.5)}, poll_s=0.05, on_hard=lambda *a: events.append(a),
                kill=lambda: events.append("kill")) as clock:
        clock.enter("store")
    time.sleep(0.8)
    assert events == []
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == previous


def test_the_setting_reads_soft_and_hard_seconds_per_stage(monkeypatch):
    monkeypatch.setenv("DYNO_STAGE_TIME_LIMITS", " optimize=1800/2000, audit=60/90 ")
    limits = env_time_limits("DYNO_STAGE_TIME_LIMITS", DEFAULTS)
    assert limits == {**DEFAULTS, "optimize": (1800, 2000), "audit": (60, 90)}
    monkeypatch.delenv("DYNO_STAGE_TIME_LIMITS")
    assert env_time_limits("DYNO_STAGE_TIME_LIMITS", DEFAULTS) == DEFAULTS


@pytest.mark.parametrize("raw, message", [
    ("tune=10/20", "unknown stage 'tune'; use one of profile, optimize, audit, store"),
    ("audit=10", "'audit=10' is not STAGE=SOFT/HARD in whole seconds"),
    ("audit=ten/20", "'audit=ten/20' is not STAGE=SOFT/HARD in whole seconds"),
    ("audit=20/20", "the hard limit must exceed it"),
    ("audit=0/20", "the soft limit must be at least 1 s"),
])
def test_the_setting_refuses_what_it_cannot_read_and_says_how_to_write_it(monkeypatch, raw, message):
    monkeypatch.setenv("DYNO_STAGE_TIME_LIMITS", raw)
    with pytest.raises(ImproperlyConfigured, match="DYNO_STAGE_TIME_LIMITS") as error:
        env_time_limits("DYNO_STAGE_TIME_LIMITS", DEFAULTS)
    assert message in str(error.value)
