"""Imported by Celery's task autodiscovery, which is how the worker hooks get connected."""

from fleet import worker  # noqa: F401
