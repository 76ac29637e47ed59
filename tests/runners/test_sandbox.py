"""The sandbox: what candidate code can see and touch, and how the parent survives it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from runners import suite
from runners.sandbox import ENV_PASSTHROUGH, MALLOC_ENVIRONMENT, REPO_ROOT, Sandbox, SandboxConfig, SandboxError, landlock_abi, sandbox_environment

CHEATS = Path(__file__).resolve().parent / "cheats"
SECRETS = {
    "DATABASE_URL": "postgres://dyno:hunter2@db/dyno",
    "DYNO_SECRET_KEY": "django-insecure-canary",
    "DYNO_SIGNING_KEY_PATH": "/etc/dyno/signing.key",
    "CELERY_BROKER_URL": "redis://:pw@broker/0",
    "OPENAI_API_KEY": "sk-canary",
    "AWS_SECRET_ACCESS_KEY": "canary",
}


@pytest.fixture(scope="module")
def sandbox():
    previous = {name: os.environ.get(name) for name in SECRETS}
    os.environ.update(SECRETS)  # the parent holds secrets, as a Celery worker does
    try:
        with Sandbox(SandboxConfig(threads=1)) as box:
            yield box
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _probe(sandbox: Sandbox, name: str) -> dict:
    """Load a probe candidate; it raises at import with a JSON report of what it could do."""
    worker = sandbox.spawn("candidate")
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    try:
        with pytest.raises(SandboxError) as caught:
            worker.call("load", timeout=30, spec=spec.to_dict(), source=(CHEATS / name).read_text(), module="probe")
    finally:
        worker.close()
    assert caught.value.code == "sandbox.import_error", caught.value
    match = re.search(r"PROBE-REPORT (.*)$", caught.value.message)
    assert match, caught.value.message
    return json.loads(match.group(1))


def test_it_builds_the_child_environment_from_an_allow_list():
    env = sandbox_environment({**SECRETS, "PATH": "/usr/bin", "TRITON_INTERPRET": "1", "MY_TOKEN": "x"}, home="/s", threads=2)
    assert not set(SECRETS) & set(env) and "MY_TOKEN" not in env
    assert env["PATH"] == "/usr/bin" and env["TRITON_INTERPRET"] == "1" and env["HOME"] == "/s"
    assert env["OMP_NUM_THREADS"] == "2" and env["PYTHONPATH"] == str(REPO_ROOT)


def test_it_shows_candidates_no_secret_from_the_parents_environment(sandbox):
    names = set(_probe(sandbox, "probe_env_secrets.py"))
    assert not names & set(SECRETS)
    forced = {"HOME", "TMPDIR", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH"}
    assert forced <= names
    assert names <= set(ENV_PASSTHROUGH) | forced | {
        "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
        "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS", "LC_CTYPE", *MALLOC_ENVIRONMENT,
    }


def test_it_lets_candidates_write_only_inside_their_scratch_directory(sandbox):
    report = _probe(sandbox, "probe_write_outside.py")
    assert report["scratch"] == "written"
    assert {report[k] for k in ("repo", "package", "tmp", "sandbox_root")} == {"PermissionError"}, report
    assert not (REPO_ROOT / "dyno_sandbox_escape.txt").exists()
    assert not (REPO_ROOT / "runners" / "dyno_sandbox_escape.py").exists()
    assert not Path("/tmp/dyno_sandbox_escape.txt").exists()


def test_it_keeps_files_outside_the_allowed_roots_unreadable(sandbox):
    secret = Path("/tmp/dyno-probe-secret")
    secret.write_text("SECRET-CONTENT")
    secret.chmod(0o644)  # readable by anyone as far as file permissions go
    try:
        report = _probe(sandbox, "probe_read_secret.py")
    finally:
        secret.unlink()
    assert report == {"/tmp": "PermissionError", "secret": "PermissionError"}


@pytest.mark.skipif(landlock_abi() < 1, reason="needs Landlock; without it /proc/<pid>/environ is guarded by uid only")
def test_it_hides_other_processes_environments(sandbox):
    canary = subprocess.Popen(["sleep", "60"], env={"DYNO_PROBE_CANARY": "1", "PATH": os.environ["PATH"]})
    try:
        report = _probe(sandbox, "probe_parent_environ.py")
    finally:
        canary.kill()
        canary.wait()
    assert report["leaked"] is False
    assert os.getpid() not in report["readable"] and canary.pid not in report["readable"]


@pytest.mark.skipif(landlock_abi() < 6, reason="signal scoping arrived in Landlock ABI 6")
def test_it_stops_candidates_from_signalling_other_processes(sandbox):
    assert _probe(sandbox, "probe_signals.py")["reachable"] == []


@pytest.mark.skipif(landlock_abi() < 4, reason="TCP rules arrived in Landlock ABI 4")
def test_it_blocks_tcp_connections(sandbox):
    assert set(_probe(sandbox, "probe_network.py").values()) == {"PermissionError"}


def test_it_reports_how_workers_are_isolated(sandbox):
    info = sandbox.info()
    assert info["landlock_abi"] == landlock_abi()
    assert info["limits"]["memory_bytes"] == SandboxConfig().memory_bytes
    if os.geteuid() == 0:
        assert info["user"] == "nobody" or info["drop_capabilities"] is True


def test_it_survives_a_worker_that_dies_and_keeps_serving_new_ones(sandbox):
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    worker = sandbox.spawn("candidate")
    with pytest.raises(SandboxError) as caught:
        worker.call("load", timeout=30, spec=spec.to_dict(), source="import os\nos._exit(9)\n", module="dies")
    assert caught.value.code == "sandbox.exit" and "9" in caught.value.message
    fresh = sandbox.spawn("candidate")
    fresh.call("load", timeout=30, spec=spec.to_dict(), source=suite.baseline_source(spec), module="ok")
    fresh.close()
