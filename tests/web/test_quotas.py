"""Per-organization quotas (runs queued or running per hardware class, upload bytes per day) and
anonymous uploads refused before their body is read."""

import json
import threading

import pytest
from django.db import connection
from django.http.multipartparser import MultiPartParser
from django.urls import reverse

from accounts.selectors import Actor
from accounts.throttle import QuotaExceeded
from catalog.models import ModelVersion
from runs.models import Run
from runs.services import audit_start, run_start

from .helpers import folder_uploads, upload_version

pytestmark = pytest.mark.django_db

OWNER = {"username": "owner@acme.test", "password": "correct-horse-battery"}
CANDIDATE = "def kernel(*inputs):\n    return inputs[0]\n"


def _auth(key: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def no_enqueue(monkeypatch):
    """Runs stay queued: nothing is sent to the broker."""
    monkeypatch.setattr("runs.services.run_enqueue", lambda run: None)


@pytest.fixture
def unread_bodies(monkeypatch):
    """Fail the test if anything parses a multipart body."""
    def parse(self):
        raise AssertionError("the multipart body was read")

    monkeypatch.setattr(MultiPartParser, "parse", parse)


def _start(client, raw, version, hardware="gpu-h200"):
    body = {"model_version": str(version.id), "hardware": hardware, "batch": 64, "seq": 8192}
    return client.post("/api/v1/runs", json.dumps(body), content_type="application/json", **_auth(raw))


def test_it_refuses_runs_past_the_active_quota_of_a_hardware_class(client, make_org, make_key, sample_models,
                                                                   media_root, settings, no_enqueue):
    settings.DYNO_QUOTA_ACTIVE_RUNS = 2
    org = make_org()
    raw = make_key(org)
    version = upload_version(org=org, folder=sample_models["llama"])
    first, second = _start(client, raw, version), _start(client, raw, version)
    assert (first.status_code, second.status_code) == (201, 201)
    refused = _start(client, raw, version)
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert "limit of 2 runs queued or running at once on gpu-h200" in error["message"]
    assert "cancel one" in error["message"]
    assert Run.objects.filter(organization=org).count() == 2
    assert _start(client, raw, version, hardware="cpu").status_code == 201  # another class has its own
    other = make_org()
    assert _start(client, make_key(other), upload_version(org=other, folder=sample_models["llama"])).status_code == 201
    client.post(f"/api/v1/runs/{first.json()['id']}/cancel", **_auth(raw))
    assert _start(client, raw, version).status_code == 201  # a finished run gives its place back


def test_it_counts_audits_with_model_runs_and_answers_pages_with_the_limit(client, make_org, sample_models,
                                                                           media_root, settings, no_enqueue):
    settings.DYNO_QUOTA_ACTIVE_RUNS = 1
    org = make_org("acme", owner=OWNER["username"])
    version = upload_version(org=org, folder=sample_models["llama"])
    audit_start(actor=Actor(roles={org.pk: "owner"}), organization_id=org.pk, workload="softmax",
                source=CANDIDATE, hardware="cpu")
    with pytest.raises(QuotaExceeded, match="limit of 1 runs queued or running at once on cpu"):
        run_start(actor=Actor(roles={org.pk: "owner"}), version=version, hardware="cpu")
    client.login(**OWNER)
    page = client.post(reverse("front:run-create", args=[version.id]), {"hardware": "cpu", "profile": "cpu-ci"})
    assert page.status_code == 409 and b"queued or running at once on cpu" in page.content


@pytest.mark.django_db(transaction=True)
def test_it_holds_the_run_quota_under_concurrent_starts(make_org, sample_models, media_root, settings, no_enqueue):
    settings.DYNO_QUOTA_ACTIVE_RUNS = 2
    org = make_org()
    version = upload_version(org=org, folder=sample_models["llama"])
    actor = Actor(roles={org.pk: "owner"})
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def start():
        try:
            barrier.wait()
            run_start(actor=actor, version=version, hardware="gpu-h200", batch=64, seq=8192)
            outcomes.append("queued")
        except QuotaExceeded:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["queued"] * 2 + ["refused"] * 4
    assert Run.objects.filter(organization=org).count() == 2


def test_it_refuses_uploads_past_the_daily_byte_quota(client, make_org, make_key, sample_models, media_root,
                                                      settings):
    size = sum(p.stat().st_size for p in sample_models["llama"].iterdir())
    settings.DYNO_QUOTA_UPLOAD_BYTES_PER_DAY = size * 3 // 2
    org = make_org()
    raw = make_key(org)
    def post():
        return client.post("/api/v1/models", {"name": "m", "files": folder_uploads(sample_models["llama"])},
                           **_auth(raw))

    assert post().status_code == 201
    refused = post()  # within the framing slack of Content-Length: counted exactly by the service
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert f"{size * 3 // 2:,} bytes a day" in error["message"] and "Try again in" in error["message"]
    assert ModelVersion.objects.count() == 1


def test_it_refuses_an_upload_the_quota_cannot_hold_before_reading_it(client, make_org, sample_models, media_root,
                                                                      settings, unread_bodies):
    size = sum(p.stat().st_size for p in sample_models["llama"].iterdir())
    settings.DYNO_QUOTA_UPLOAD_BYTES_PER_DAY = size
    org = make_org("acme", owner=OWNER["username"])
    upload_version(org=org, folder=sample_models["llama"])  # spends the whole day's quota
    client.login(**OWNER)
    refused = client.post(reverse("front:upload"), {"name": "m", "files": folder_uploads(sample_models["llama"])})
    assert refused.status_code == 429
    assert b"upload quota" in refused.content and 1 <= int(refused["Retry-After"]) <= 86400


def test_it_answers_the_upload_page_with_the_quota(client, make_org, sample_models, media_root, settings):
    size = sum(p.stat().st_size for p in sample_models["llama"].iterdir())
    settings.DYNO_QUOTA_UPLOAD_BYTES_PER_DAY = size * 3 // 2
    make_org("acme", owner=OWNER["username"])
    client.login(**OWNER)
    def upload():
        return client.post(reverse("front:upload"), {"name": "m", "files": folder_uploads(sample_models["llama"])})

    assert upload().status_code == 302
    refused = upload()
    assert refused.status_code == 429 and b"upload quota" in refused.content and refused["Retry-After"]


def test_it_refuses_anonymous_uploads_before_reading_them(client, make_org, sample_models, unread_bodies):
    files = folder_uploads(sample_models["llama"])
    page = client.post(reverse("front:upload"), {"name": "m", "files": files})
    assert page.status_code == 302 and page["Location"].startswith(reverse("front:signin"))
    api = client.post("/api/v1/models", {"name": "m", "files": files})
    assert api.status_code == 401 and api.json()["error"]["code"] == "unauthenticated"
    bad_key = client.post("/api/v1/models", {"name": "m", "files": files}, HTTP_AUTHORIZATION="Bearer dyno_x_y")
    assert bad_key.status_code == 401
    audit = client.post("/audits/new", {"workload": "softmax", "candidate": files[0]})
    assert audit.status_code == 302
    # Signed in, the body is read (and this test's parser refuses to): the guard let it through.
    make_org("acme", owner=OWNER["username"])
    client.login(**OWNER)
    with pytest.raises(AssertionError, match="multipart body was read"):
        client.post(reverse("front:upload"), {"name": "m", "files": files})


def test_it_refuses_uploads_that_cannot_succeed_before_reading_them(client, make_org, make_key, make_member,
                                                                    sample_models, settings, unread_bodies):
    files = folder_uploads(sample_models["llama"])
    org = make_org("acme", owner=OWNER["username"])
    # A key that may not write models (an auditor's): 403 from the declared headers alone.
    auditor = client.post("/api/v1/models", {"name": "m", "files": files}, **_auth(make_key(org, scope="auditor")))
    assert auditor.status_code == 403 and auditor.json()["error"]["code"] == "forbidden"
    # A member whose role may not write models (finance), on the page.
    make_member(org, "finance@acme.test", role="finance")
    client.login(username="finance@acme.test", password="correct-horse-battery")
    page = client.post(reverse("front:upload"), {"name": "m", "files": files})
    assert page.status_code == 403 and b"cannot upload models" in page.content
    # Larger than any model may be: 413 before a byte is spooled.
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.DYNO_UPLOAD_MAX_TOTAL_BYTES = 1024
    big = SimpleUploadedFile("model.safetensors", b"\0" * (2 << 20))
    too_big = client.post("/api/v1/models", {"name": "m", "files": [big]}, **_auth(make_key(org)))
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "too_large"
    assert "at most 1,024" in too_big.json()["error"]["message"]


def test_it_refuses_a_model_upload_without_a_declared_length(client, make_org, make_key, unread_bodies):
    org = make_org("acme", owner=OWNER["username"])
    request = client.post  # Django's test client always declares a length: drop it from the environ
    response = request("/api/v1/models", b"--x\r\n", content_type="multipart/form-data; boundary=x",
                       CONTENT_LENGTH="", **_auth(make_key(org)))
    assert response.status_code == 411 and response.json()["error"]["code"] == "length_required"


def test_it_refuses_a_model_too_large_for_its_hardware_class(client, make_org, make_key, sample_models, media_root,
                                                            settings, no_enqueue):
    org = make_org()
    raw = make_key(org)
    version = upload_version(org=org, folder=sample_models["llama"])
    settings.DYNO_RUN_MAX_PARAMETERS = {"cpu": version.parameter_count - 1, "gpu-h200": version.parameter_count}
    refused = _start(client, raw, version, hardware="cpu")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "run_rejected"
    message = refused.json()["error"]["message"]
    assert f"{version.parameter_count:,} parameters" in message and "larger hardware class" in message
    assert _start(client, raw, version, hardware="gpu-h200").status_code == 201
    assert Run.objects.filter(organization=org).count() == 1  # the refused one left nothing behind
