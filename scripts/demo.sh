#!/usr/bin/env bash
# `make demo`: migrate, seed the demo org, start a real Celery worker and the web server.
# Embedded defaults (SQLite and a filesystem broker under var/); DATABASE_URL and
# CELERY_BROKER_URL are honoured when set. Stays in the foreground until Ctrl-C.
# Development settings, asked for explicitly (Dyno's default is production), on loopback only.
set -euo pipefail
export DYNO_ENV=development
cd "$(dirname "$0")/.."
PORT=${PORT:-8000}
BIN=.venv/bin
mkdir -p var/broker var/broker-control var/media var/sample-models

# PDF downloads (reports, invoices) are drawn by WeasyPrint with the system's Pango; the rest of the
# demo runs without it, so a missing Pango is said, not fatal.
if ! $BIN/python -c 'import ctypes.util, sys; sys.exit(not ctypes.util.find_library("pango-1.0"))'; then
  echo "make demo: Pango is not installed, so PDF downloads will fail (everything else works)." >&2
  echo "  Debian/Ubuntu: sudo apt-get install libpango-1.0-0 libpangoft2-1.0-0; macOS: brew install pango" >&2
fi

$BIN/python manage.py migrate --noinput
$BIN/python manage.py seed_demo
if [ ! -f var/sample-models/tiny-llama/config.json ]; then
  $BIN/python -m runners.samples var/sample-models/tiny-llama --family llama >/dev/null
fi
echo "A small Hugging Face model folder to upload: $(pwd)/var/sample-models/tiny-llama"

# The worker measures (cpu) and does the platform's chores (control) here; as a runner it reports to
# the web server's control API with a runner key made afresh for this demo (docs/operations.md, Roles).
$BIN/python manage.py runner_key create demo-runner --hardware cpu --token-file var/runner-token --replace
(cd platform && DYNO_CONTROL_URL="http://127.0.0.1:$PORT" DYNO_RUNNER_TOKEN="$(cat ../var/runner-token)" \
  exec ../$BIN/celery -A dyno worker -Q cpu,control -c 1 -B -n "demo-cpu@%h" \
  -l info --logfile ../var/worker.log) &
WORKER=$!
trap 'kill $WORKER 2>/dev/null; wait $WORKER 2>/dev/null' EXIT INT TERM
echo "Celery worker started (pid $WORKER, log var/worker.log)"
echo "Dyno is at http://127.0.0.1:$PORT/  (Ctrl-C stops the server and the worker)"
$BIN/python manage.py runserver "127.0.0.1:$PORT" --noreload
