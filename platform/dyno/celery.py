"""The Celery application: one queue per hardware class, plus `control` for platform chores.

Workers start as `celery -A dyno worker -Q <hardware class> -c 1` (one worker per device).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dyno.settings")

app = Celery("dyno")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
