"""Control-side chores of runs (they need the database): the reaper. The runner's task is
runs.runner (imported here so that Celery's autodiscovery registers it)."""

from __future__ import annotations

from celery import shared_task

from runs import runner  # noqa: F401  (registers runs.execute)
from runs.services import runs_reap_stale, runs_resend_unclaimed


@shared_task(name="runs.reap_stale")
def reap_stale() -> list[str]:
    runs_resend_unclaimed()
    return runs_reap_stale()
