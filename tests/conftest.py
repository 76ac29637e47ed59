"""Fixtures shared by all tests: organizations, users, keys, isolated media, worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def media_root(tmp_path, settings):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.MEDIA_ROOT.mkdir()
    return settings.MEDIA_ROOT


@pytest.fixture
def make_org(db):
    from accounts.services import organization_create

    def make(slug: str | None = None, *, owner: str | None = None, password: str = "correct-horse-battery"):
        slug = slug or f"org-{uuid.uuid4().hex[:8]}"
        org = organization_create(slug=slug, name=slug.title(), owner_email=owner, owner_password=password)
        return org

    return make


@pytest.fixture
def make_member(db):
    from accounts.services import member_add

    def make(org, email: str, role: str = "member", password: str = "correct-horse-battery"):
        # Test fixtures act as the operator, who alone appoints auditors.
        return member_add(organization=org, email=email, role=role, password=password, operator=True)

    return make


@pytest.fixture
def make_key(db):
    from accounts.services import api_key_create

    def make(org, scope: str = "customer", name: str = "test"):
        # Test fixtures act as the operator, who alone grants auditor keys.
        return api_key_create(organization=org, scope=scope, name=name, operator=True)[1]

    return make


@pytest.fixture(scope="session")
def sample_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny real Hugging Face model folders, written once per test session."""
    from runners.samples import write_sample_model

    base = tmp_path_factory.mktemp("sample-models")
    return {
        "llama": write_sample_model(base / "llama", "llama"),
        "llama-card": write_sample_model(base / "llama-card", "llama", weights=False),
    }


class WorkerProcess:
    """A real `celery worker` process on the test broker and the test database."""

    def __init__(self, *, queues: str, database_name: str, media_root: Path, control_url: str, token: str,
                 extra_env: dict | None = None, name: str | None = None, runner_only: bool = False):
        self.name = name or f"test-{uuid.uuid4().hex[:8]}@localhost"
        self.queues = queues.split(",")
        env = dict(os.environ)
        base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/dyno")
        if runner_only:
            # What a runner host holds: the broker and its runner key, no database credentials.
            env.pop("DATABASE_URL", None)
            env["DYNO_ROLE"] = "runner"
        else:
            env["DATABASE_URL"] = base.rsplit("/", 1)[0] + "/" + database_name
        env.update({
            "DYNO_CONTROL_URL": control_url,
            "DYNO_RUNNER_TOKEN": token,
            "DYNO_RUNNER_CACHE": str(media_root.parent / f"runner-cache-{uuid.uuid4().hex[:6]}"),
            "DYNO_MEDIA_ROOT": str(media_root),
            "DYNO_HEARTBEAT_SECONDS": "1",
            # A runner's start-up calibration takes a minute; the test that needs it turns it on.
            "DYNO_RUNNER_CALIBRATION": "off",
            # Small model runs: the two heaviest workloads, a short search, one tuning cache per session.
            "DYNO_RUN_WORKLOAD_LIMIT": "2",
            "DYNO_TUNE_BUDGET_SECONDS": "4",
            # One whole-model compile configuration in the search, not eight (each is a compile).
            "DYNO_OPTIMIZER_COMPILE_VARIANTS": "cpp-wrapper-fixed-modules",
            "DYNO_TUNING_CACHE": str(Path(os.environ.get("PYTEST_TUNING_CACHE", media_root.parent / "tuning.jsonl"))),
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        })
        self.calibration_off = env.get("DYNO_RUNNER_CALIBRATION") == "off"
        self.log = media_root.parent / f"worker-{self.name.split('@')[0]}-{uuid.uuid4().hex[:4]}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dyno", "worker", "-Q", queues, "-c", "1",
             "-n", self.name, "-l", "info", "--without-gossip", "--without-mingle"],
            cwd=ROOT / "platform", env=env, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_registered(self, timeout: float = 60.0) -> None:
        """A runner: until the platform registered it; a control worker: until it is ready."""
        from django.conf import settings

        from fleet.models import Runner

        runner = any(q in settings.DYNO_HARDWARE_CLASSES for q in self.queues)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.log.read_text()[-4000:]}")
            if Runner.objects.filter(hostname=self.name).exists() if runner else " ready." in self.log.read_text():
                if runner and self.calibration_off:
                    self.stand_in_calibration()
                return
            time.sleep(0.2)
        raise AssertionError(f"worker did not register in {timeout}s:\n{self.log.read_text()[-4000:]}")

    def stand_in_calibration(self) -> None:
        """A passing calibration stored for this runner by the test, as its operator: a real one
        takes a minute (tests/web/test_calibration.py runs it), and the platform bills nothing from
        a runner it holds none for."""
        from fleet.services import runner_calibration_record

        runner_calibration_record(hostname=self.name, calibration={
            "schema": "dyno.calibration/1", "profile": "cpu-ci", "summary": {"workloads": 1, "unstable": 0},
            "workloads": [{"key": "rmsnorm", "stable": True, "baseline_verdict": "accepted"}],
            "verdict": {"billable": True, "message": "stood in for by the test suite"}})

    def kill(self) -> None:
        """kill -9 of the whole worker (main process and its pool children)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.kill()


@pytest.fixture(scope="session", autouse=True)
def tuning_cache(tmp_path_factory):
    """One tuning cache for every worker of the session: later runs of the same shapes hit it."""
    path = tmp_path_factory.mktemp("tuning") / "tuning.jsonl"
    os.environ["PYTEST_TUNING_CACHE"] = str(path)
    yield path
    os.environ.pop("PYTEST_TUNING_CACHE", None)


@pytest.fixture
def broker_clean():
    """An empty test broker database, so one test's messages never reach another's worker."""
    import redis
    from django.conf import settings

    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.fail("integration tests need CELERY_BROKER_URL=redis://... (make test sets it)")
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield settings.CELERY_BROKER_URL
    client.flushdb()


@pytest.fixture
def runner_token(transactional_db):
    """A live runner key for every hardware class: what a runner host holds besides the broker."""
    from django.conf import settings

    from fleet.keys import runner_key_create

    _, token = runner_key_create(name=f"test-{uuid.uuid4().hex[:8]}", hardware=list(settings.DYNO_HARDWARE_CLASSES))
    return token


@pytest.fixture
def control_api(live_server, runner_token, settings):
    """This process as a runner: its control client talks to the live server with a runner key,
    and the worker name a task executed in process uses is registered with it."""
    import socket

    from fleet.control_client import ControlClient
    from runners.fingerprint import environment_fingerprint

    settings.DYNO_CONTROL_URL = live_server.url
    settings.DYNO_RUNNER_TOKEN = runner_token
    ControlClient().register(hostname=socket.gethostname(), queues=["cpu"], fingerprint=environment_fingerprint("cpu"))
    return live_server.url


@pytest.fixture
def start_worker(transactional_db, media_root, broker_clean, live_server, runner_token):
    """Real Celery workers. Runners report to the control API of a live server in this process
    (the test database), as they do in production; `runner_only` starts one without database
    credentials (DYNO_ROLE=runner, no DATABASE_URL)."""
    from django.db import connection

    workers: list[WorkerProcess] = []

    def start(queues: str = "cpu,control", name: str | None = None, runner_only: bool = False,
              **extra_env) -> WorkerProcess:
        from fleet.models import Runner

        if name:
            Runner.objects.filter(hostname=name).delete()  # so registration is observed afresh
        worker = WorkerProcess(queues=queues, database_name=connection.settings_dict["NAME"],
                               media_root=media_root, control_url=live_server.url, token=runner_token,
                               extra_env={k: str(v) for k, v in extra_env.items()}, name=name,
                               runner_only=runner_only)
        workers.append(worker)
        worker.wait_registered()
        return worker

    yield start
    for worker in workers:
        worker.stop()


def wait_for(predicate, *, timeout: float, interval: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
