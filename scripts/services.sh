#!/usr/bin/env bash
# Make sure the services the tests use are up: PostgreSQL, Redis, and Chromium for browser tests.
# Starts local ones that are installed but stopped; says clearly what is missing otherwise.
set -uo pipefail
missing=()

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
if ! pg_up; then
  echo "PostgreSQL is not answering on 127.0.0.1:5432; trying to start the local one..."
  (service postgresql start || pg_ctlcluster --skip-systemctl-redirect 15 main start) >/dev/null 2>&1 || true
  for _ in $(seq 1 20); do pg_up && break; sleep 0.5; done
  pg_up || missing+=("PostgreSQL on 127.0.0.1:5432 (install: apt-get install postgresql; or set TEST_DATABASE_URL)")
fi

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
if ! redis_up; then
  echo "Redis is not answering on 127.0.0.1:6379; trying to start the local one..."
  (service redis-server start || redis-server --daemonize yes --save "" --appendonly no) >/dev/null 2>&1 || true
  for _ in $(seq 1 20); do redis_up && break; sleep 0.5; done
  redis_up || missing+=("Redis on 127.0.0.1:6379 (install: apt-get install redis-server; or set TEST_BROKER_URL)")
fi

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing Debian's chromium for the browser tests..."
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 || true
  fi
  command -v chromium >/dev/null 2>&1 || missing+=("chromium for browser tests (apt-get install chromium)")
fi

# The sandbox runs candidate code under bubblewrap; without it results say they do not bill and
# tests/runners/test_sandbox.py fails.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing bubblewrap for the sandbox..."
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || true
  fi
  command -v bwrap >/dev/null 2>&1 || missing+=("bubblewrap for the sandbox (apt-get install bubblewrap)")
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "Cannot run the tests; missing:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi
echo "services: PostgreSQL, Redis, chromium and bubblewrap are ready"
