"""Strict parsing of the environment variables that configure Dyno.

A typo in production configuration must stop the process with a message, not be read as a default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw == "True":
        return True
    if raw == "False":
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: use exactly True or False.")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a whole number.") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be at least {minimum}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int_map(name: str, default: dict[str, int], *, minimum: int = 1) -> dict[str, int]:
    """`KEY=N,KEY=N` (e.g. `cpu=1500000000,gpu-h200=20000000000`), each N a whole number >= minimum;
    keys not given keep their default."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return dict(default)
    values = dict(default)
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        key, _, number = item.partition("=")
        try:
            value = int(number.replace("_", ""))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not KEY=N with N a whole number.") from None
        if not key.strip() or value < minimum:
            raise ImproperlyConfigured(f"{name}: {item!r} needs a key and a number of at least {minimum}.")
        values[key.strip()] = value
    return values


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name) or default
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r}: expected one of {', '.join(choices)}.")
    return value


def env_time_limits(name: str, default: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """`stage=SOFT/HARD,...` in whole seconds, e.g. `optimize=1800/2000,audit=1200/1400`.

    Stages not named keep their default; each hard limit must exceed its soft one."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return dict(default)
    limits = dict(default)
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        stage, _, pair = item.partition("=")
        soft, _, hard = pair.partition("/")
        stage = stage.strip()
        if stage not in default:
            raise ImproperlyConfigured(f"{name}: unknown stage {stage!r}; use one of {', '.join(default)}.")
        try:
            values = int(soft), int(hard)
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not STAGE=SOFT/HARD in whole seconds (e.g. {stage}=1800/2000).") from None
        if values[0] < 1 or values[1] <= values[0]:
            raise ImproperlyConfigured(
                f"{name}: {item!r}: the soft limit must be at least 1 s and the hard limit must exceed it.")
        limits[stage] = values
    return limits


@dataclass(frozen=True)
class DatabaseUrl:
    engine: str
    name: str
    user: str = ""
    password: str = ""
    host: str = ""
    port: str = ""
    options: dict[str, str] | None = None

    def django(self) -> dict:
        config: dict = {"ENGINE": self.engine, "NAME": self.name}
        if self.engine.endswith("postgresql"):
            config.update(
                USER=self.user, PASSWORD=self.password, HOST=self.host, PORT=self.port,
                CONN_MAX_AGE=60, CONN_HEALTH_CHECKS=True, OPTIONS=self.options or {},
            )
        return config


def parse_database_url(url: str, *, base_dir: Path) -> DatabaseUrl:
    """`postgres://user:pass@host:port/name?sslmode=require` or `sqlite:///relative/or/absolute`."""
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured("DATABASE_URL names no database: add /NAME at the end.")
        options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        return DatabaseUrl(
            engine="django.db.backends.postgresql", name=name,
            user=unquote(parts.username or ""), password=unquote(parts.password or ""),
            host=parts.hostname or "", port=str(parts.port or ""), options=options,
        )
    if parts.scheme == "sqlite":
        # sqlite:///var/dyno.sqlite3 is relative to the project; sqlite:////abs/path is absolute.
        raw = url[len("sqlite:///"):]
        path = Path(raw) if raw.startswith("/") else base_dir / raw
        return DatabaseUrl(engine="django.db.backends.sqlite3", name=str(path))
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported: use postgres://... or sqlite:///..."
    )
