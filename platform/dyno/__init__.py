"""Dyno's Django project package: settings, URLs, the Celery app."""

import sys
from pathlib import Path

# `celery -A dyno` and gunicorn import this package without manage.py: put the repo root on the
# path so the pure packages (runners, optimizer, metering) import the same way everywhere.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from dyno.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
