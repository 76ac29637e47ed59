"""The customer CLI (`python -m dyno_client`) against a live server: upload with a progress bar,
a run followed to its end, a report downloaded and verified offline, usage posted in batches with
keys derived from content."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(url: str, key: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "dyno_client", "--url", url, "--key", key, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def server(transactional_db, live_server, make_org, make_key, settings, tmp_path, monkeypatch):
    settings.DYNO_SIGNING_KEY_PATH = str(tmp_path / "keys" / "report-signing.pem")
    settings.DYNO_AUDIT_KEY_PATH = tmp_path / "keys" / "audit-hmac.key"
    settings.MEDIA_ROOT = str(tmp_path / "media")
    monkeypatch.setattr("runs.services.run_enqueue", lambda run: None)  # no runner: the test moves the run
    org = make_org("acme")
    return live_server.url, org, make_key(org)


def test_it_uploads_a_folder_and_follows_a_run_to_its_end(server, sample_models):
    from runs.models import Run

    url, org, key = server
    uploaded = _cli(url, key, "upload", str(sample_models["llama"]), "--name", "tiny")
    assert uploaded.returncode == 0, uploaded.stderr
    version = json.loads(uploaded.stdout)["model_version"]
    assert "uploading llama [" in uploaded.stderr and "100%" in uploaded.stderr  # the byte progress bar

    def finish_soon():
        deadline = time.monotonic() + 60
        while not Run.objects.filter(model_version_id=version).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        run = Run.objects.get(model_version_id=version)
        Run.objects.filter(pk=run.pk).update(status="running", stage="audit", progress=0.5)
        time.sleep(1.0)
        Run.objects.filter(pk=run.pk).update(status="failed", error="stopped by the test")

    mover = threading.Thread(target=finish_soon)
    mover.start()
    followed = _cli(url, key, "run", "--model-version", version, "--hardware", "cpu", "--wait", "--poll-seconds", "0.2")
    mover.join()
    assert followed.returncode == 1, followed.stderr  # failed: exit 1, the error said
    assert json.loads(followed.stdout)["status"] == "failed" and "stopped by the test" in followed.stdout
    assert "running, audit" in followed.stderr


def test_it_downloads_a_report_and_verifies_it_offline(server, tmp_path):
    from reports.services import report_create_for_run
    from tests.web.test_reaudit import _audit_run

    url, org, key = server
    report = report_create_for_run(run=_audit_run(org))
    got = _cli(url, key, "report", "get", str(report.pk), "--out", str(tmp_path / "r"), "--verify")
    assert got.returncode == 0, got.stderr + got.stdout
    assert got.stdout.startswith("VALID")
    assert (tmp_path / "r" / "report.json").read_bytes() == bytes(report.body_bytes)
    missing = _cli(url, key, "report", "get", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 2 and "HTTP 404 not_found" in missing.stderr


def test_it_posts_usage_in_batches_and_a_second_post_duplicates(server, tmp_path, make_report, make_contract,
                                                                 make_deployment):
    url, org, key = server
    make_contract(org)
    deployment = make_deployment(org, make_report(org))
    from datetime import timedelta

    from django.utils import timezone

    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=12)
    lines = [json.dumps({"deployment": str(deployment.pk), "timestamp": (hour + timedelta(hours=h)).isoformat(),
                         "gpu_hours": "1.5"}) for h in range(5)]
    lines.append(json.dumps({"deployment": "not-ours", "timestamp": "2026-01-01T00:00:00+00:00", "gpu_hours": "1"}))
    usage = tmp_path / "usage.jsonl"
    usage.write_text("\n".join(lines) + "\n")
    first = _cli(url, key, "usage", "post", str(usage), "--batch-size", "2")
    summary = json.loads(first.stdout)
    assert (summary["created"], summary["duplicate"], summary["rejected"]) == (5, 0, 1), first.stdout
    assert first.returncode == 1  # something was rejected
    again = json.loads(_cli(url, key, "usage", "post", str(usage)).stdout)
    assert (again["created"], again["duplicate"], again["rejected"]) == (0, 5, 1)  # keys derived from content
