"""The OpenAPI document is a valid 3.1 document, and what the API really answers follows the
schemas it documents (the Run schema had drifted: 9 properties listed, 19 to 23 answered)."""

from __future__ import annotations

import jsonschema
import pytest
from openapi_spec_validator import validate

from .helpers import upload_version
from .test_reaudit import _audit_run, _model_run

pytestmark = pytest.mark.django_db


def _document(client) -> dict:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def _conforms(document: dict, schema_name: str, instance: dict) -> None:
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": document["components"]}
    jsonschema.Draft202012Validator(schema).validate(instance)


def test_the_document_is_valid_openapi(client):
    validate(_document(client))


def test_runs_models_and_versions_answer_what_the_document_says(client, make_org, make_key, sample_models, media_root):
    from runs.models import RunEvent

    document = _document(client)
    org = make_org()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {make_key(org)}"}
    version = upload_version(org=org, folder=sample_models["llama"], name="uploaded")
    model_run = _model_run(org, artifact={"schema": "dyno.optimization-artifact/1"}, inventory={"workloads": []})
    RunEvent.objects.create(run=model_run, stage="profile", message="profiled")
    for run in (model_run, _audit_run(org)):
        answer = client.get(f"/api/v1/runs/{run.pk}", **auth).json()
        _conforms(document, "Run", answer)  # additionalProperties: false, so nothing undocumented
    queued = client.post("/api/v1/runs", {"model_version": str(version.pk), "hardware": "cpu"},
                         content_type="application/json", **auth)
    assert queued.status_code == 201, queued.content
    _conforms(document, "Run", queued.json())
    _conforms(document, "ModelVersion", client.get(f"/api/v1/model-versions/{version.pk}", **auth).json())
    _conforms(document, "Model", client.get(f"/api/v1/models/{version.model_id}", **auth).json())
    with pytest.raises(jsonschema.ValidationError):  # the check has teeth: an undocumented field fails it
        _conforms(document, "Run", {**client.get(f"/api/v1/runs/{model_run.pk}", **auth).json(), "worker": "box"})
