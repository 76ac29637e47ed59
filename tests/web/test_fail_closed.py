"""Fail closed: production unless development is asked for, development only on loopback, a
Content-Security-Policy that no template needs to loosen, and SQLite writers that wait their turn."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRONG = "k" * 20 + "Zq9-xW2_vP7#mL4@" + "abcdefghijklmnopqrstuvwxyz0123456789"


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DYNO_") and k not in (
        "DATABASE_URL", "CELERY_BROKER_URL")}
    clean.update(env)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=180)


def _check(**env: str) -> subprocess.CompletedProcess:
    return _run(["manage.py", "check"], **env)


def test_it_starts_in_production_when_nobody_asks_for_development():
    result = _check()
    assert result.returncode != 0
    assert "DYNO_ENV is not set" in result.stderr and "DYNO_ENV=development" in result.stderr
    assert _check(DYNO_ENV="development").returncode == 0


def test_it_refuses_development_settings_for_a_host_beyond_loopback():
    debug = _check(DYNO_ENV="development", DYNO_ALLOWED_HOSTS="dyno.example")
    assert debug.returncode != 0 and "dyno.example" in debug.stderr and "refused" in debug.stderr
    default_key = _check(DYNO_ENV="development", DYNO_ALLOWED_HOSTS="*", DYNO_DEBUG="False")
    assert default_key.returncode != 0 and "*" in default_key.stderr
    assert _check(DYNO_ENV="development", DYNO_ALLOWED_HOSTS="dyno.example", DYNO_DEBUG="False",
                  DYNO_SECRET_KEY=STRONG).returncode == 0
    loopback = _check(DYNO_ENV="development", DYNO_ALLOWED_HOSTS="127.0.0.1,localhost,[::1],app.localhost")
    assert loopback.returncode == 0, loopback.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/signin", "/api/v1/openapi.json", "/api/v1/models"])
def test_it_sends_a_content_security_policy_on_pages_and_the_api(client, path):
    policy = client.get(path)["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert "'unsafe-inline'" not in directives["default-src"]


SCRIPT = re.compile(r"<script\b([^>]*)>", re.IGNORECASE)
HANDLER = re.compile(r"<[a-z][^>]*\son[a-z]+\s*=", re.IGNORECASE)


def test_no_template_carries_a_script_the_policy_would_block():
    templates = sorted((ROOT / "templates").rglob("*.html")) + sorted((ROOT / "platform").glob("*/templates/**/*.html"))
    assert templates
    for template in templates:
        text = template.read_text()
        for attributes in SCRIPT.findall(text):
            # json_script blocks are data (type="application/json"), never executed.
            assert "src=" in attributes or "application/json" in attributes, f"inline <script> in {template}"
        assert not HANDLER.search(text), f"an on* event attribute in {template}"
        assert "javascript:" not in text, f"a javascript: URL in {template}"


@pytest.mark.slow
def test_concurrent_finalizations_on_sqlite_wait_their_turn(tmp_path):
    """Six finalizations at once on the demo's SQLite: each gets its gapless number, none
    'database is locked' (a deferred transaction cannot take the write lock it later needs)."""
    env = {"DYNO_ENV": "development", "DATABASE_URL": f"sqlite:///{tmp_path}/dyno.sqlite3",
           "DYNO_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "dyno.settings",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'platform'}"}
    migrated = _run(["manage.py", "migrate", "--noinput"], **env)
    assert migrated.returncode == 0, migrated.stderr
    result = _run(["-c", FINALIZE_AT_ONCE], **env)
    assert result.returncode == 0, result.stderr
    numbers = json.loads(result.stdout.splitlines()[-1])
    assert [n.startswith("INV-") and n.rsplit("-", 1)[1] for n in numbers] == [f"{n:06d}" for n in range(1, 7)], numbers


FINALIZE_AT_ONCE = """
import json, threading
from datetime import date
from decimal import Decimal
import django
django.setup()
from django.db import connection, connections
from django.utils import timezone
from accounts.models import Organization
from metering.invoices import invoice_finalize
from metering.models import BillingRun, Invoice

run = BillingRun.objects.create(period=date(2025, 1, 1), cutoff=timezone.now())
invoices = [Invoice.objects.create(organization=Organization.objects.create(slug=f"org-{i}", name=f"Org {i}"),
                                   run=run, period=run.period, currency="EUR", total=Decimal("1.00"))
            for i in range(6)]
connections.close_all()
start = threading.Barrier(len(invoices))
outcomes = []

def finalize(invoice):
    start.wait()
    try:
        outcomes.append(invoice_finalize(invoice=invoice, actor="system:test").number)
    except Exception as exc:
        outcomes.append(f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()

threads = [threading.Thread(target=finalize, args=(invoice,)) for invoice in invoices]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(sorted(outcomes)))
"""


def test_per_class_parameter_caps_parse_and_refuse_nonsense(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from dyno.env import env_int_map

    monkeypatch.setenv("DYNO_X", "cpu=10, gpu-h200=2_000")
    assert env_int_map("DYNO_X", {"cpu": 1, "gpu-h100": 5}) == {"cpu": 10, "gpu-h100": 5, "gpu-h200": 2000}
    for bad in ("cpu", "cpu=ten", "=5", "cpu=0"):
        monkeypatch.setenv("DYNO_X", bad)
        with pytest.raises(ImproperlyConfigured, match="DYNO_X"):
            env_int_map("DYNO_X", {})
