"""The run state machine: statuses, stages and the only transitions allowed between them."""

from __future__ import annotations

from django.db import models


class Status(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Stage(models.TextChoices):
    WAITING = "waiting"
    PROFILE = "profile"
    OPTIMIZE = "optimize"
    AUDIT = "audit"
    STORE = "store"
    DONE = "done"


TRANSITIONS: dict[str, frozenset[str]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED}),
    Status.RUNNING: frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}
FINISHED = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})


def sources_of(target: str) -> list[str]:
    """The statuses a run may be in for a move to `target`; used as the conditional UPDATE's filter."""
    return [source for source, targets in TRANSITIONS.items() if target in targets]
