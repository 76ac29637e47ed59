"""WSGI entry point for gunicorn: `gunicorn --chdir platform dyno.wsgi`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dyno.settings")
application = get_wsgi_application()
