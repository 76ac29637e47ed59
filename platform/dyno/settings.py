"""Dyno's Django settings, read from the environment (see docs/operations.md).

Fail closed: production unless `DYNO_ENV=development` is asked for (make demo and make test do), and
production refuses to start without real secrets; development refuses to face anything but loopback.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from dyno.env import env_bool, env_choice, env_int, env_int_map, env_list, env_str, env_time_limits, parse_database_url

BASE_DIR = Path(__file__).resolve().parents[2]
VAR_DIR = Path(env_str("DYNO_VAR_DIR", str(BASE_DIR / "var")))

# A deployment that forgets DYNO_ENV gets production, never DEBUG and the repository's key.
DYNO_ENV = env_choice("DYNO_ENV", "production", ("development", "production"))
PRODUCTION = DYNO_ENV == "production"

_DEV_SECRET = "dyno-development-secret-key-not-for-production-use-0123456789"
SECRET_KEY = env_str("DYNO_SECRET_KEY", _DEV_SECRET)
DEBUG = env_bool("DYNO_DEBUG", not PRODUCTION)
# `testserver` is the Host of Django's test client; it never resolves to a real machine.
_LOOPBACK_NAMES = ("localhost", "testserver")
ALLOWED_HOSTS = env_list("DYNO_ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "testserver"])

_database_url = env_str("DATABASE_URL")
_broker_url = env_str("CELERY_BROKER_URL")

# A runner host executes hostile candidate code: with DYNO_ROLE=runner its worker holds the broker's
# address and a runner key for the control API (fleet.control_api), never database credentials
# (docs/operations.md, Roles). Any other role (web, control, or both with runner queues in
# development) is "platform".
DYNO_ROLE = env_choice("DYNO_ROLE", "platform", ("platform", "runner"))
RUNNER = DYNO_ROLE == "runner"
DYNO_CONTROL_URL = env_str("DYNO_CONTROL_URL", "" if PRODUCTION else "http://127.0.0.1:8000")
DYNO_RUNNER_TOKEN = env_str("DYNO_RUNNER_TOKEN", "")
if RUNNER and _database_url:
    raise ImproperlyConfigured("DYNO_ROLE=runner holds no database credentials: unset DATABASE_URL on runner hosts "
                               "(runners report through DYNO_CONTROL_URL with DYNO_RUNNER_TOKEN).")
if RUNNER and PRODUCTION and DYNO_CONTROL_URL and not DYNO_CONTROL_URL.startswith("https://"):
    raise ImproperlyConfigured(f"DYNO_CONTROL_URL={DYNO_CONTROL_URL!r}: a runner sends its key with every request, so "
                               "production runners reach the control API over https:// only.")
if RUNNER and not os.environ.get("DYNO_SECRET_KEY"):
    # Signs nothing a runner hands out (it serves no pages and no sessions): never the web's key.
    SECRET_KEY = secrets.token_urlsafe(64)


def _is_loopback(host: str) -> bool:
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or "*", or ".example.com"): it may be reached from anywhere


if PRODUCTION:
    needed = ((("CELERY_BROKER_URL", _broker_url), ("DYNO_CONTROL_URL", DYNO_CONTROL_URL),
               ("DYNO_RUNNER_TOKEN", DYNO_RUNNER_TOKEN)) if RUNNER else
              (("DYNO_SECRET_KEY", os.environ.get("DYNO_SECRET_KEY")), ("DATABASE_URL", _database_url),
               ("CELERY_BROKER_URL", _broker_url), ("DYNO_ALLOWED_HOSTS", os.environ.get("DYNO_ALLOWED_HOSTS"))))
    missing = [name for name, value in needed if not value]
    if missing:
        unset = "" if os.environ.get("DYNO_ENV") else (
            " DYNO_ENV is not set, and Dyno starts with production settings unless told otherwise: for a "
            "local run or the tests set DYNO_ENV=development (make demo and make test do).")
        raise ImproperlyConfigured(
            f"DYNO_ENV=production needs {', '.join(missing)}: set them (see docs/operations.md, Production deployment).{unset}"
        )
    if SECRET_KEY == _DEV_SECRET or len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5:
        raise ImproperlyConfigured(
            "DYNO_SECRET_KEY is the development default or too weak: generate one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(64))'`."
        )
    if DEBUG:
        raise ImproperlyConfigured("DYNO_DEBUG=True is refused in production.")
else:
    _public = [host for host in ALLOWED_HOSTS if not _is_loopback(host)]
    if _public and (DEBUG or SECRET_KEY == _DEV_SECRET):
        # Development's debug pages and published key would be served to whoever reaches that host.
        raise ImproperlyConfigured(
            f"DYNO_ALLOWED_HOSTS names {', '.join(_public)}, which is not this machine's loopback: development "
            "settings (DEBUG, the repository's secret key) are refused there. Use DYNO_ENV=production with its "
            "secrets, or set DYNO_DEBUG=False and a DYNO_SECRET_KEY of your own."
        )

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "accounts",
    "auditlog",
    "catalog",
    "runs",
    "fleet",
    "reports",
    "metering",
    "api",
    "front",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Before any view hook: refuses anonymous uploads unread, throttles public forms, answers limits.
    "dyno.guards.RequestGuard",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dyno.headers.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "dyno.urls"
WSGI_APPLICATION = "dyno.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "front.context.navigation",
            ],
        },
    },
]

DATABASES = {
    "default": parse_database_url(
        _database_url or "sqlite:///var/dyno.sqlite3", base_dir=BASE_DIR
    ).django()
}
if RUNNER:
    # Django's dummy backend: any query on a runner raises ImproperlyConfigured, loudly.
    DATABASES = {"default": {"ENGINE": "django.db.backends.dummy"}}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # SQLite has no row locks: a transaction that reads, then writes, fails at once with "database is
    # locked" when another took the write lock between (select_for_update is a no-op there). Taking
    # the write lock at BEGIN makes concurrent writers (two finalizations, the web and the worker)
    # wait their turn for up to `timeout` seconds instead; WAL lets readers go on meanwhile.
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20,
                                       "init_command": "PRAGMA journal_mode=WAL;"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "front:signin"
LOGIN_REDIRECT_URL = "front:dashboard"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "platform" / "static"]
MEDIA_ROOT = Path(env_str("DYNO_MEDIA_ROOT", str(VAR_DIR / "media")))
WHITENOISE_USE_FINDERS = not PRODUCTION

# Uploads: the request body may carry a whole model; files stream to disk past 2.5 MB.
DYNO_UPLOAD_MAX_FILE_BYTES = env_int("DYNO_UPLOAD_MAX_FILE_BYTES", 2 * 1024**3, minimum=1)
DYNO_UPLOAD_MAX_TOTAL_BYTES = env_int("DYNO_UPLOAD_MAX_TOTAL_BYTES", 8 * 1024**3, minimum=1)
DYNO_UPLOAD_MAX_FILES = env_int("DYNO_UPLOAD_MAX_FILES", 64, minimum=1)
# An architecture card (config.json alone) is built with random weights on a runner: its size is
# what the config describes, so it is capped (2e9 parameters: 8 GB in float32).
DYNO_CARD_MAX_PARAMETERS = env_int("DYNO_CARD_MAX_PARAMETERS", 2_000_000_000, minimum=1)
# Counting a config's parameters builds its module tree on the meta device in a forked child of the
# web process, under these limits (catalog.bounded).
DYNO_MODEL_BUILD_SECONDS = env_int("DYNO_MODEL_BUILD_SECONDS", 20, minimum=1)
DYNO_MODEL_BUILD_MEMORY_BYTES = env_int("DYNO_MODEL_BUILD_MEMORY_BYTES", 2 * 1024**3, minimum=64 * 1024**2)
DATA_UPLOAD_MAX_NUMBER_FILES = DYNO_UPLOAD_MAX_FILES + 1
FILE_UPLOAD_TEMP_DIR = None

# Sign-in lock-out: this many failures for one account or address inside the window locks it.
DYNO_SIGNIN_MAX_FAILURES = env_int("DYNO_SIGNIN_MAX_FAILURES", 5, minimum=1)
DYNO_SIGNIN_LOCKOUT_SECONDS = env_int("DYNO_SIGNIN_LOCKOUT_SECONDS", 900, minimum=1)
# An address is locked after this many failures on any usernames, but only for failing attempts from
# browsers without a device proof: the password is still checked there, so a flood of made-up names
# does not lock real users out. Each failure also counts towards its account's lock.
DYNO_SIGNIN_ADDRESS_MAX_FAILURES = env_int("DYNO_SIGNIN_ADDRESS_MAX_FAILURES", 4 * DYNO_SIGNIN_MAX_FAILURES, minimum=1)
AUTHENTICATION_BACKENDS = ["accounts.backends.LockoutBackend"]
# The client's address: REMOTE_ADDR, or behind proxies the header they append the client's address
# to (e.g. X-Forwarded-For), read from the right past DYNO_TRUSTED_PROXY_COUNT of them. Set it only
# when every request comes through those proxies: otherwise a client writes its own address.
DYNO_TRUSTED_PROXY_HEADER = env_str("DYNO_TRUSTED_PROXY_HEADER", "").strip()
if DYNO_TRUSTED_PROXY_HEADER and not (DYNO_TRUSTED_PROXY_HEADER.isascii()
                                      and DYNO_TRUSTED_PROXY_HEADER.replace("-", "").isalnum()):
    raise ImproperlyConfigured(f"DYNO_TRUSTED_PROXY_HEADER={DYNO_TRUSTED_PROXY_HEADER!r}: give a header name "
                               "such as X-Forwarded-For or X-Real-IP.")
DYNO_TRUSTED_PROXY_COUNT = env_int("DYNO_TRUSTED_PROXY_COUNT", 1, minimum=1)
# The networks runner hosts reach the control API (/runner/v1/) from; anywhere else it answers 404.
# Empty: any address (the runner key still decides).
DYNO_CONTROL_API_NETWORKS = []
for _network in env_list("DYNO_CONTROL_API_NETWORKS", []):
    try:
        DYNO_CONTROL_API_NETWORKS.append(ipaddress.ip_network(_network, strict=False))
    except ValueError:
        raise ImproperlyConfigured(f"DYNO_CONTROL_API_NETWORKS: {_network!r} is not a network; write CIDRs separated "
                                   "by commas, e.g. 10.20.0.0/16,fd00:dyno::/48") from None
# Posts to the public forms (sign-in, /admin/login/, /verify) per client address per fixed window.
DYNO_THROTTLE_ANONYMOUS_POSTS = env_int("DYNO_THROTTLE_ANONYMOUS_POSTS", 30, minimum=1)
DYNO_THROTTLE_WINDOW_SECONDS = env_int("DYNO_THROTTLE_WINDOW_SECONDS", 60, minimum=1)
# API requests refused for their key (401: missing, unknown, revoked) per client address per window;
# past it the address gets 429 before any key is looked up, so keys cannot be guessed at speed.
DYNO_THROTTLE_BAD_KEYS = env_int("DYNO_THROTTLE_BAD_KEYS", 60, minimum=1)
# Per-organization quotas: runs queued or running at once on each hardware class (more are refused
# with 409 until one ends), and upload bytes received per UTC day, accepted or not (429 until then).
DYNO_QUOTA_ACTIVE_RUNS = env_int("DYNO_QUOTA_ACTIVE_RUNS", 10, minimum=1)
# Signed checkpoints of the audit log's head (verify_auditlog --checkpoint): point this at storage
# the database host cannot rewrite.
DYNO_AUDIT_CHECKPOINT_DIR = Path(env_str("DYNO_AUDIT_CHECKPOINT_DIR", str(VAR_DIR / "audit-checkpoints")))
# Open disputes of one report (they join one re-audit; one per person or key).
DYNO_DISPUTES_PER_REPORT = env_int("DYNO_DISPUTES_PER_REPORT", 5, minimum=1)
DYNO_QUOTA_UPLOAD_BYTES_PER_DAY = env_int("DYNO_QUOTA_UPLOAD_BYTES_PER_DAY", 64 * 1024**3, minimum=1)

# /metrics (Prometheus text format) answers only `Authorization: Bearer <this>`; unset: no endpoint.
DYNO_METRICS_TOKEN = env_str("DYNO_METRICS_TOKEN", "")
# Runner fleet: a runner is live while it heartbeats; a run whose worker fell silent is reaped.
DYNO_HARDWARE_CLASSES = env_list("DYNO_HARDWARE_CLASSES", ["cpu", "gpu-h100", "gpu-h200"])
# The largest model (parameters) a run may measure on each hardware class: a model run holds three
# copies side by side (baseline, optimized, A/A control), fp32 on CPU (1.5e9 x 4 B x 3 = 18 GB) and
# bf16 on GPUs (H100 80 GB: 12e9 x 2 B x 3 = 72 GB; H200 141 GB: 20e9 -> 120 GB). A class not listed
# gets DYNO_RUN_MAX_PARAMETERS_DEFAULT. `DYNO_RUN_MAX_PARAMETERS=cpu=N,gpu-h200=N` overrides.
DYNO_RUN_MAX_PARAMETERS_DEFAULT = env_int("DYNO_RUN_MAX_PARAMETERS_DEFAULT", 1_500_000_000, minimum=1)
DYNO_RUN_MAX_PARAMETERS = env_int_map("DYNO_RUN_MAX_PARAMETERS", {
    "cpu": 1_500_000_000, "gpu-h100": 12_000_000_000, "gpu-h200": 20_000_000_000})
DYNO_HEARTBEAT_SECONDS = env_int("DYNO_HEARTBEAT_SECONDS", 10, minimum=1)
DYNO_RUN_STALE_SECONDS = env_int("DYNO_RUN_STALE_SECONDS", 120, minimum=2)
DYNO_REAPER_SECONDS = env_int("DYNO_REAPER_SECONDS", 30, minimum=1)
# A queued run nobody claimed (and nothing logged on) this long is sent to its queue again.
DYNO_RUN_RESEND_SECONDS = env_int("DYNO_RUN_RESEND_SECONDS", 900, minimum=10)
# Model runs: the tuning cache (JSON lines; a warm hit skips the search), how many of a model's
# heaviest workloads a run tunes and audits, and the search budget per workload.
DYNO_TUNING_CACHE = Path(env_str("DYNO_TUNING_CACHE", str(VAR_DIR / "tuning-cache.jsonl")))
# Where a runner keeps the model files it fetched from the control API (checked by SHA-256 each run).
DYNO_RUNNER_CACHE = Path(env_str("DYNO_RUNNER_CACHE", str(VAR_DIR / "runner-cache")))
DYNO_RUN_WORKLOAD_LIMIT = env_int("DYNO_RUN_WORKLOAD_LIMIT", 6, minimum=1)
DYNO_TUNE_BUDGET_SECONDS = env_int("DYNO_TUNE_BUDGET_SECONDS", 20, minimum=1)
# Whether a model run's optimizer also tries whole-model torch.compile configurations (each costs a
# compile in the search and another per phase of the end-to-end audit when it is chosen).
DYNO_OPTIMIZER_WHOLE_MODEL_COMPILE = env_bool("DYNO_OPTIMIZER_WHOLE_MODEL_COMPILE", True)
# Which of those configurations the search tries (names of optimizer.model.COMPILE_VARIANTS, comma
# separated; empty: all eight). A runner with an unknown name refuses to start.
DYNO_OPTIMIZER_COMPILE_VARIANTS = env_list("DYNO_OPTIMIZER_COMPILE_VARIANTS", [])
# Time limits, read by the worker that executes a run: each stage has its own soft and hard limit
# (DYNO_STAGE_TIME_LIMITS, "stage=SOFT/HARD,..." in seconds, restarted as the run enters the
# stage), and the whole run has one more. Past a soft limit the run fails naming its stage; past a
# hard one the pool process is killed and the run failed with it. Transient infrastructure errors
# (database or broker unreachable) are retried this many times with backoff; anything else ends
# the run on the first try.
DYNO_STAGE_TIME_LIMITS = env_time_limits(
    "DYNO_STAGE_TIME_LIMITS",
    {"profile": (600, 660), "optimize": (2400, 2520), "audit": (2400, 2520), "store": (300, 360)},
)
DYNO_RUN_SOFT_TIME_LIMIT_SECONDS = env_int("DYNO_RUN_SOFT_TIME_LIMIT_SECONDS", 3600, minimum=1)
DYNO_RUN_HARD_TIME_LIMIT_SECONDS = env_int("DYNO_RUN_HARD_TIME_LIMIT_SECONDS", 3900, minimum=2)
if DYNO_RUN_HARD_TIME_LIMIT_SECONDS <= DYNO_RUN_SOFT_TIME_LIMIT_SECONDS:
    raise ImproperlyConfigured(
        f"DYNO_RUN_HARD_TIME_LIMIT_SECONDS={DYNO_RUN_HARD_TIME_LIMIT_SECONDS} must exceed "
        f"DYNO_RUN_SOFT_TIME_LIMIT_SECONDS={DYNO_RUN_SOFT_TIME_LIMIT_SECONDS}: the soft limit fails the "
        "run cleanly, the hard one only kills what ignored it."
    )
DYNO_RUN_TRANSIENT_RETRIES = env_int("DYNO_RUN_TRANSIENT_RETRIES", 4, minimum=0)
# Audits of submitted candidates: the sandbox's memory limit, and a cap on the harness's load and
# first-call timeouts (0 keeps the protocol's own: 60 s to load, 300 s for a first call).
DYNO_AUDIT_MEMORY_MIB = env_int("DYNO_AUDIT_MEMORY_MIB", 8192, minimum=256)
DYNO_AUDIT_CALL_TIMEOUT_SECONDS = env_int("DYNO_AUDIT_CALL_TIMEOUT_SECONDS", 0, minimum=0)
# Re-audits are started as they are requested; this sweep also starts any that were missed and
# settles those whose run ended (and makes reports a lost message never made).
DYNO_REAUDIT_SWEEP_SECONDS = env_int("DYNO_REAUDIT_SWEEP_SECONDS", 60, minimum=1)

# Report signing: the Ed25519 private key (mode 0600). Development creates it on first use;
# production refuses to sign without it. Only `control` workers need it, never runner boxes.
DYNO_SIGNING_KEY_PATH = Path(env_str("DYNO_SIGNING_KEY_PATH", str(VAR_DIR / "keys" / "report-signing.pem")))
# The audit log's HMAC key (mode 0600), kept outside the database so whoever can write the database
# cannot rewrite the log unnoticed. Development creates it on first use; production requires it on
# web and control hosts (`manage.py check --deploy` says when it is missing). Runner boxes never need it.
DYNO_AUDIT_KEY_PATH = Path(env_str("DYNO_AUDIT_KEY_PATH", str(VAR_DIR / "keys" / "audit-hmac.key")))
# Days after signing during which a customer may dispute a report (contracts override it).
DYNO_REPORT_DISPUTE_DAYS = env_int("DYNO_REPORT_DISPUTE_DAYS", 30, minimum=0)
# Re-measurements an organization's auditors and disputes may start per dispute window (the
# operator's are not counted): a re-roll until a low figure appears is the attack this bounds.
DYNO_REAUDITS_PER_WINDOW = env_int("DYNO_REAUDITS_PER_WINDOW", 2, minimum=0)
# Whether the platform accepts a runner's word that its operator allows billable figures from a
# sandbox lacking a protection (the runner's DYNO_SANDBOX_ALLOW_INCOMPLETE). Off: the platform
# clears that allowance in every stored result, so such figures do not bill whatever a runner says.
DYNO_SANDBOX_ALLOW_INCOMPLETE = env_bool("DYNO_SANDBOX_ALLOW_INCOMPLETE", False)
# A runner calibrates itself when it starts (A/A audits, runners.calibrate): `auto` (cpu-ci on CPU,
# gpu on GPU), a profile name, or `off`. Reports measured on a runner whose calibration failed do
# not bill. DYNO_RUNNER_CALIBRATION_WORKLOADS limits it to a comma-separated subset.
DYNO_RUNNER_CALIBRATION = env_str("DYNO_RUNNER_CALIBRATION") or "auto"
DYNO_RUNNER_CALIBRATION_WORKLOADS = env_str("DYNO_RUNNER_CALIBRATION_WORKLOADS") or ""
# Whether a result bills only from a runner whose passing calibration this platform stored. On (the
# default): a result from a runner with none stored (calibration off, not finished, or never
# posted) is recorded as from an uncalibrated runner and does not bill. Off only where the operator
# vouches for the fleet by other means.
DYNO_REQUIRE_RUNNER_CALIBRATION = env_bool("DYNO_REQUIRE_RUNNER_CALIBRATION", True)

# Billing: the organization whose finance members and finance keys bill every customer org, and
# the margin behind "now" a billing run stops taking usage (above 4 x the 30 s ingestion timeout).
DYNO_BILLING_OPERATOR_ORG = env_str("DYNO_BILLING_OPERATOR_ORG", "")
DYNO_BILLING_CUTOFF_MARGIN_SECONDS = env_int("DYNO_BILLING_CUTOFF_MARGIN_SECONDS", 300, minimum=0)

CELERY_BROKER_URL = _broker_url or "filesystem://"
if CELERY_BROKER_URL == "filesystem://":
    _queue_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "control_folder": str(VAR_DIR / "broker-control"),
    }
else:
    # A long visibility timeout: runs are long; a dead worker's run is reaped by heartbeat instead.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
CELERY_TASK_ACKS_LATE = True
# A lost broker connection leaves a running run alone: its result goes to the database, and a run
# is claimed once, so a redelivered message could not restart it anyway.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "control"
# Each worker also consumes its own queue (`<hostname>.dq2`): a runner's calibration runs on it.
CELERY_WORKER_DIRECT = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "reap-stale-runs": {"task": "runs.reap_stale", "schedule": float(DYNO_REAPER_SECONDS),
                        "options": {"queue": "control", "expires": float(DYNO_REAPER_SECONDS)}},
    "reports-sweep": {"task": "reports.sweep", "schedule": float(DYNO_REAUDIT_SWEEP_SECONDS),
                      "options": {"queue": "control", "expires": float(DYNO_REAUDIT_SWEEP_SECONDS)}},
    # Hourly: each tick bills every closed month due (from the 3rd, 03:00) and unbilled, oldest first,
    # so a tick missed while the control worker was down is made up by the next one (metering/tasks.py).
    "metering-bill-due-periods": {"task": "metering.bill_due_periods", "schedule": crontab(minute=0),
                                  "options": {"queue": "control", "expires": 3600.0}},
    # Daily: the audit log's head, signed, written outside the database (auditlog/checkpoint.py).
    "auditlog-checkpoint": {"task": "auditlog.checkpoint", "schedule": crontab(minute=5, hour=0),
                            "options": {"queue": "control", "expires": 3600.0}},
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"quiet_control_api": {"()": "dyno.quiet.QuietControlApi"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("DYNO_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"},
                "django.server": {"handlers": ["console"], "filters": ["quiet_control_api"], "level": "INFO",
                                  "propagate": False}},
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Scripts only from this origin's files: templates carry no inline <script> or on* attribute (chart
# data travels in json_script blocks, which are not executed). Styles allow inline attributes
# because plotly.js sets them as it draws; images allow data: for its exported PNGs.
DYNO_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("DYNO_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("DYNO_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
