"""Settings are read strictly from the environment; production refuses weak or missing secrets."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from dyno.env import env_bool, env_int, parse_database_url

ROOT = Path(__file__).resolve().parents[2]
STRONG = "k" * 20 + "Zq9-xW2_vP7#mL4@" + "abcdefghijklmnopqrstuvwxyz0123456789"


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DYNO_") and k not in (
        "DATABASE_URL", "CELERY_BROKER_URL")}
    clean.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=120)


def test_it_refuses_anything_but_true_or_false(monkeypatch):
    monkeypatch.setenv("DYNO_FLAG", "yes")
    with pytest.raises(ImproperlyConfigured, match="exactly True or False"):
        env_bool("DYNO_FLAG", False)
    monkeypatch.setenv("DYNO_FLAG", "False")
    assert env_bool("DYNO_FLAG", True) is False


def test_it_refuses_a_number_that_is_not_one(monkeypatch):
    monkeypatch.setenv("DYNO_N", "ten")
    with pytest.raises(ImproperlyConfigured, match="whole number"):
        env_int("DYNO_N", 1)


def test_it_parses_database_urls():
    pg = parse_database_url("postgres://u:p%40ss@db.example:6543/dyno?sslmode=require", base_dir=ROOT)
    assert (pg.engine, pg.name, pg.user, pg.password, pg.host, pg.port) == (
        "django.db.backends.postgresql", "dyno", "u", "p@ss", "db.example", "6543")
    assert pg.options == {"sslmode": "require"}
    lite = parse_database_url("sqlite:///var/x.sqlite3", base_dir=ROOT)
    assert lite.name == str(ROOT / "var" / "x.sqlite3")
    with pytest.raises(ImproperlyConfigured, match="not supported"):
        parse_database_url("mysql://x/y", base_dir=ROOT)


def test_it_refuses_production_without_secrets():
    result = _manage("check", DYNO_ENV="production")
    assert result.returncode != 0
    assert "DYNO_SECRET_KEY" in result.stderr and "DATABASE_URL" in result.stderr


def test_it_refuses_the_default_secret_in_production():
    result = _manage("check", DYNO_ENV="production",
                     DYNO_SECRET_KEY="dyno-development-secret-key-not-for-production-use-0123456789",
                     DATABASE_URL="postgres://postgres@127.0.0.1:5432/dyno",
                     CELERY_BROKER_URL="redis://127.0.0.1:6379/0", DYNO_ALLOWED_HOSTS="dyno.example")
    assert result.returncode != 0
    assert "development default" in result.stderr


def test_it_passes_the_deploy_check_in_production(tmp_path):
    audit_key = tmp_path / "audit-hmac.key"
    audit_key.write_text("a" * 64)
    audit_key.chmod(0o600)
    result = _manage("check", "--deploy", "--fail-level", "WARNING", DYNO_ENV="production",
                     DYNO_SECRET_KEY=STRONG, DATABASE_URL="postgres://postgres@127.0.0.1:5432/dyno",
                     CELERY_BROKER_URL="redis://127.0.0.1:6379/0", DYNO_ALLOWED_HOSTS="dyno.example",
                     DYNO_AUDIT_KEY_PATH=str(audit_key))
    assert result.returncode == 0, result.stderr + result.stdout
