"""A logging filter for the development server's request lines: runners' successful calls to the
control API (a heartbeat every few seconds, progress on every round) would drown everything else."""

from __future__ import annotations

import logging


class QuietControlApi(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (" /runner/v1/" in message and getattr(record, "status_code", 500) < 400)
