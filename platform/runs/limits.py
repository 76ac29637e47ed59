"""Time limits per stage of a run, enforced inside the process that executes it.

Celery gives a task one soft and one hard limit; a run is several stages of very different length
(profiling takes seconds, tuning and auditing take most of an hour), so each stage gets its own,
restarted as the run enters it (settings.DYNO_STAGE_TIME_LIMITS). The task's own Celery limits
stay on as the whole run's envelope.

- Soft: SIGALRM in the executing thread raises Celery's `SoftTimeLimitExceeded`, which every layer
  already lets through (a time limit is never the candidate's fault), wherever the run is: in the
  harness, waiting on a sandbox, or storing; `expired` then names the stage and its limit.
- Hard: a watchdog thread, for code that never returns to Python (a native call that hangs),
  records the failure and kills the pool process, as Celery's own hard limit does.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from celery.exceptions import SoftTimeLimitExceeded

log = logging.getLogger(__name__)


def _kill_pool_process() -> None:
    """SIGKILL this process if it is a pool child (its parent restarts it); a solo worker is the
    whole worker, so it only logs and leaves the run's own hard limit to act."""
    from billiard.process import current_process

    if "PoolWorker" in current_process().name:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        log.error("hard stage limit passed outside a pool process; not killing the worker")


class StageClock:
    """Soft and hard time limits per stage; a context manager around one run's execution."""

    def __init__(
        self,
        limits: dict[str, tuple[int, int]],
        *,
        on_hard: Callable[[str, int], None],
        kill: Callable[[], None] = _kill_pool_process,
        poll_s: float = 0.5,
    ) -> None:
        self.limits = limits
        self.stage: str | None = None
        self.expired: tuple[str, int] | None = None  # (stage, soft seconds) once a soft limit fired
        self._on_hard = on_hard
        self._kill = kill
        self._poll_s = poll_s
        self._started = 0.0
        self._hard_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Signal handlers belong to the main thread; elsewhere (a threaded pool) `check` polls.
        self._signals = threading.current_thread() is threading.main_thread()
        self._previous: object = None
        self._watchdog = threading.Thread(target=self._watch, name="dyno-stage-watchdog", daemon=True)

    def __enter__(self) -> StageClock:
        if self._signals:
            self._previous = signal.signal(signal.SIGALRM, self._alarm)
        self._watchdog.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._signals:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)
        self._watchdog.join(timeout=5)

    def enter(self, stage: str) -> None:
        """The run is now in `stage`: its limits start counting (again only if the stage changed)."""
        if stage == self.stage or stage not in self.limits or self.expired:
            return
        soft, hard = self.limits[stage]
        with self._lock:
            self.stage = stage
            self._started = time.monotonic()
            self._hard_at = self._started + hard
        if self._signals:
            signal.setitimer(signal.ITIMER_REAL, soft)

    def restart(self) -> None:
        """Count the current stage's limits from now: the runner's own calibration, taken inside a
        run's first stage (fleet.tasks.calibrate_before_measuring), is not the run's time."""
        stage, self.stage = self.stage, None
        if stage is not None:
            self.enter(stage)

    def check(self) -> None:
        """Raise if the current stage is past its soft limit (for threads that get no signal)."""
        if self.stage is not None and time.monotonic() - self._started > self.limits[self.stage][0]:
            self._expire()

    def _alarm(self, signum: int, frame: object) -> None:
        self._expire()

    def _expire(self) -> None:
        assert self.stage is not None
        soft = self.limits[self.stage][0]
        self.expired = (self.stage, soft)
        raise SoftTimeLimitExceeded(f"stage {self.stage} ran past its {soft} s limit")

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            with self._lock:
                stage, hard_at = self.stage, self._hard_at
            if stage is None or hard_at is None or time.monotonic() < hard_at:
                continue
            try:
                self._on_hard(stage, self.limits[stage][1])
            except Exception:  # recording is best effort: the kill must happen regardless
                log.exception("could not record the hard limit of stage %s", stage)
            finally:
                if not self._stop.is_set():
                    self._kill()
            return


def time_limit_error(stage: str, *, seconds: int, hard: bool = False, per_stage: bool = False) -> str:
    """What a run that ran out of time says, for the customer and the operator alike."""
    setting = ("DYNO_STAGE_TIME_LIMITS" if per_stage
               else "DYNO_RUN_HARD_TIME_LIMIT_SECONDS" if hard else "DYNO_RUN_SOFT_TIME_LIMIT_SECONDS")
    what = f"stage {stage} exceeded" if per_stage else f"the run, in stage {stage}, exceeded"
    if hard:
        return f"{what} the hard time limit of {seconds} s and its process was killed ({setting})."
    return (f"{what} its time limit of {seconds} s ({setting}); the run was stopped. Start it with a "
            "smaller batch or sequence, or ask an operator to raise the limit.")


# How a run's task can end outside its own handlers (the worker's main process says which).
OUTSIDE_KINDS = ("hard_time_limit", "soft_time_limit", "worker_lost", "other")


def failed_outside_error(*, kind: str, stage: str, detail: str = "") -> str:
    """The error of a run whose task ended outside its own handlers, written where the run's stage
    is known (the control side): a hard time limit, a pool process that died, anything else."""
    from django.conf import settings

    if kind == "hard_time_limit":
        return time_limit_error(stage, seconds=settings.DYNO_RUN_HARD_TIME_LIMIT_SECONDS, hard=True)
    if kind == "soft_time_limit":
        return time_limit_error(stage, seconds=settings.DYNO_RUN_SOFT_TIME_LIMIT_SECONDS)
    if kind == "worker_lost":
        return f"the worker process executing stage {stage} died ({detail}); nothing was stored. Start the run again."
    return detail or "the run's task ended unexpectedly."
