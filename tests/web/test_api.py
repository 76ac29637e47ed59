"""The REST API: bearer keys, JSON errors, uploads, runs, and the OpenAPI document."""

import json

import pytest
from django.urls import reverse

from accounts.models import ApiKey
from accounts.services import api_key_revoke
from runs.models import Run

from .helpers import folder_uploads, upload_version

pytestmark = pytest.mark.django_db


def _auth(key: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_it_requires_a_key(client):
    response = client.get("/api/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


def test_it_refuses_a_revoked_key(client, make_org, make_key):
    org = make_org()
    raw = make_key(org)
    api_key_revoke(key=ApiKey.objects.get(organization=org))
    response = client.get("/api/v1/models", **_auth(raw))
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"


def test_it_refuses_a_garbage_key(client):
    response = client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer dyno_nope_nope")
    assert response.status_code == 401


def test_it_refuses_the_wrong_scope(client, make_org, make_key):
    raw = make_key(make_org(), scope="finance")
    response = client.get("/api/v1/models", **_auth(raw))
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden_scope"


def test_it_uploads_through_the_api(client, make_org, make_key, sample_models, media_root):
    raw = make_key(make_org())
    response = client.post("/api/v1/models", {"name": "api-model", "files": folder_uploads(sample_models["llama"])},
                           **_auth(raw))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["family"] == "llama" and {f["path"] for f in body["files"]} >= {"config.json", "model.safetensors"}
    listing = client.get("/api/v1/models", **_auth(raw)).json()
    assert [m["name"] for m in listing["models"]] == ["api-model"]


def test_it_reports_an_upload_refusal_as_json(client, make_org, make_key, media_root):
    from django.core.files.uploadedfile import SimpleUploadedFile

    raw = make_key(make_org())
    response = client.post("/api/v1/models", {"name": "x", "files": [SimpleUploadedFile("model.pt", b"x")]},
                           **_auth(raw))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "pickle_format"


def test_it_starts_and_cancels_a_run(client, make_org, make_key, sample_models, media_root,
                                     django_capture_on_commit_callbacks):
    org = make_org()
    raw = make_key(org)
    version = upload_version(org=org, folder=sample_models["llama"])
    body = {"model_version": str(version.id), "hardware": "cpu", "batch": 2, "seq": 16}
    # The enqueue runs on commit; capture it instead of sending it to the broker.
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post("/api/v1/runs", json.dumps(body), content_type="application/json", **_auth(raw))
    assert response.status_code == 201, response.content
    assert len(callbacks) == 1
    run = response.json()
    assert (run["status"], run["batch"], run["seq"]) == ("queued", 2, 16)
    detail = client.get(f"/api/v1/runs/{run['id']}", **_auth(raw)).json()
    assert detail["events"][0]["message"].startswith("queued on cpu")
    cancelled = client.post(f"/api/v1/runs/{run['id']}/cancel", **_auth(raw))
    assert cancelled.json()["status"] == "cancelled"
    again = client.post(f"/api/v1/runs/{run['id']}/cancel", **_auth(raw))
    assert again.status_code == 409


@pytest.mark.parametrize("body, code", [
    ("{not json", "invalid_json"),
    ("[]", "invalid_json"),
    ('{"hardware": "cpu"}', "missing_field"),
    ('{"model_version": "not-an-id", "hardware": "cpu"}', "invalid_id"),
])
def test_it_explains_bad_run_requests(client, make_org, make_key, body, code):
    raw = make_key(make_org())
    response = client.post("/api/v1/runs", body, content_type="application/json", **_auth(raw))
    assert response.status_code == 400 and response.json()["error"]["code"] == code


def test_it_refuses_unknown_hardware(client, make_org, make_key, sample_models, media_root):
    org = make_org()
    raw = make_key(org)
    version = upload_version(org=org, folder=sample_models["llama"])
    response = client.post("/api/v1/runs", json.dumps({"model_version": str(version.id), "hardware": "tpu-v9"}),
                           content_type="application/json", **_auth(raw))
    assert response.status_code == 400 and "tpu-v9" in response.json()["error"]["message"]
    assert Run.objects.count() == 0


def test_it_publishes_an_openapi_document(client):
    doc = client.get(reverse("api:openapi-json")).json()
    assert doc["openapi"].startswith("3.")
    for path in ("/models", "/models/{model_id}", "/runs", "/runs/{run_id}", "/runs/{run_id}/cancel", "/audits",
                 "/audits/{run_id}", "/reports/{report_id}", "/usage/batch", "/billing-runs"):
        assert path in doc["paths"]
    assert doc["components"]["securitySchemes"]["Bearer"]["scheme"] == "bearer"
