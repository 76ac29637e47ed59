"""Hostile input gets a refusal that says what to change, never a 500: one error contract under
/api/ (JSON for every status, no internals), JSON parsed within a size and a nesting cap wherever it
comes from outside, safetensors headers type-checked field by field, upload names the file system
can hold, instants inside a sane window, and sizes checked before a body is read."""

from __future__ import annotations

import io
import json
import logging
import struct
import time
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http.multipartparser import MultiPartParser
from django.test import Client, RequestFactory

from api import errors
from api.auth import JSON_BODY_MAX_BYTES
from catalog.models import ModelVersion
from metering.models import Deployment, UsageEvent
from runs.models import Run
from runs.services import MAX_CANDIDATE_BYTES
from tests.metering.conftest import make_report, make_version, unchecked_deployment  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000 + "]" * 100_000
# Past year 9999 once converted to UTC: parses, then overflows datetime in the conversion.
BEYOND_9999 = "9999-12-31T23:59:59-01:00"


def _auth(key: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _error(response, status: int, code: str | None = None) -> str:
    """Assert the JSON error envelope of /api/ and return its message."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    if code is not None:
        assert body["error"]["code"] == code, body
    message = body["error"]["message"]
    assert "Traceback" not in message and "/work/" not in message and "site-packages" not in message
    return message


@pytest.fixture
def key(make_org, make_key):
    return make_key(make_org())


def _nothing_uploaded(media_root) -> None:
    assert ModelVersion.objects.count() == 0
    assert [p for p in media_root.rglob("*") if p.is_file()] == []


def _upload(client, key, files: list[SimpleUploadedFile]):
    return client.post("/api/v1/models", {"name": "hostile", "files": files}, **_auth(key))


def _refuse_reading(monkeypatch) -> None:
    """Make any parse of a multipart body fail the test: a refusal must come before it."""
    def parse(self):
        raise AssertionError("the request body was read before its size was checked")
    monkeypatch.setattr(MultiPartParser, "parse", parse)


# -- deeply nested JSON -------------------------------------------------------------------------


def test_it_refuses_a_deeply_nested_api_body(client, key):
    response = client.post("/api/v1/runs", DEEP, content_type="application/json", **_auth(key))
    message = _error(response, 400, "too_deep")
    assert "64 levels" in message and "flatten" in message
    assert Run.objects.count() == 0


def test_it_refuses_a_deeply_nested_config_json(client, key, media_root):
    response = _upload(client, key, [SimpleUploadedFile("config.json", DEEP.encode())])
    message = _error(response, 400, "invalid_json")
    assert message.startswith("config.json nests") and "flatten" in message
    _nothing_uploaded(media_root)


def _safetensors(header: object | str, data: bytes = b"") -> bytes:
    raw = (header if isinstance(header, str) else json.dumps(header)).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def test_it_refuses_a_deeply_nested_safetensors_header(client, key, media_root, sample_models):
    config = (sample_models["llama"] / "config.json").read_bytes()
    response = _upload(client, key, [SimpleUploadedFile("config.json", config),
                                     SimpleUploadedFile("model.safetensors", _safetensors(DEEP))])
    message = _error(response, 400, "bad_safetensors")
    assert "model.safetensors is not a valid safetensors file" in message and "levels deep" in message
    _nothing_uploaded(media_root)


def test_it_refuses_a_deeply_nested_signature_on_the_public_verify_page(client):
    response = client.post("/verify", {"report": SimpleUploadedFile("report.json", b"{}"),
                                       "signature": SimpleUploadedFile("report.sig.json", DEEP.encode())})
    assert response.status_code == 422
    page = response.content.decode()
    assert "malformed_signature" in page and "the signature file nests more than 64 levels" in page
    assert "download it again" in page


def test_it_counts_nesting_in_linear_time_and_not_inside_strings():
    from api.bounded import MAX_DEPTH, InputRejected, json_loads_bounded

    assert json_loads_bounded('{"a": "[[[[", "b": "\\"[[["}', max_bytes=100, what="x") == {"a": "[[[[", "b": '"[[['}
    json_loads_bounded("[" * MAX_DEPTH + "]" * MAX_DEPTH, max_bytes=1000, what="x")
    with pytest.raises(InputRejected, match="more than 64 levels"):
        json_loads_bounded("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), max_bytes=1000, what="x")
    # A quote and a megabyte of escaped quotes: a scanner that retried at every quote took hours.
    started = time.monotonic()
    with pytest.raises(InputRejected, match="not valid JSON"):
        json_loads_bounded('"' + '\\"' * 2**20, max_bytes=4 * 2**20, what="x")
    assert time.monotonic() - started < 5


# -- safetensors header fields ------------------------------------------------------------------


@pytest.mark.parametrize("entry, says", [
    ({"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}, "unknown dtype"),
    ({"dtype": {"F32": 1}, "shape": [1], "data_offsets": [0, 4]}, "unknown dtype"),
    ({"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}, "non-negative integers"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "non-negative integers"),
    ({"dtype": "F32", "shape": [10**90] * 64, "data_offsets": [0, 4]}, "offsets span"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "wrong order"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}, "two non-negative integers"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}, "outside the 4-byte data buffer"),
])
def test_it_type_checks_every_field_of_a_safetensors_header(client, key, media_root, sample_models, entry, says):
    config = (sample_models["llama"] / "config.json").read_bytes()
    weights = _safetensors({"w": entry}, b"\0" * 4)
    response = _upload(client, key, [SimpleUploadedFile("config.json", config),
                                     SimpleUploadedFile("model.safetensors", weights)])
    message = _error(response, 400, "bad_safetensors")
    assert says in message and "Re-save it" in message
    _nothing_uploaded(media_root)


# -- upload names -------------------------------------------------------------------------------


def test_it_refuses_two_uploaded_files_with_the_same_name(client, key, media_root, sample_models):
    config = (sample_models["llama"] / "config.json").read_bytes()
    response = _upload(client, key, [SimpleUploadedFile("config.json", config),
                                     SimpleUploadedFile("config.json", config)])
    message = _error(response, 400, "duplicate_file")
    assert "'config.json' is given twice" in message and "keep one file per name" in message
    _nothing_uploaded(media_root)


@pytest.mark.parametrize("name", [
    "é" * 200 + ".json",  # 205 characters (Django keeps it), 405 bytes: ENAMETOOLONG before
    "folder/" + "a" * 256 + "/config.json",
])
def test_it_refuses_upload_names_over_255_bytes(client, key, media_root, name):
    from accounts.models import Organization
    from accounts.selectors import Actor
    from catalog.services import NamedUpload, model_version_upload
    from catalog.validation import UploadRejected

    if "/" not in name:  # through the API: Django keeps the browser's file name (the last part)
        response = _upload(client, key, [SimpleUploadedFile(name, b"{}")])
        message = _error(response, 400, "name_too_long")
    else:  # folder uploads (the upload page) send relative paths beside the files
        org = Organization.objects.get()
        with pytest.raises(UploadRejected) as caught:
            model_version_upload(actor=Actor(roles={org.pk: "owner"}), organization=org, model_name="hostile",
                                 uploads=[NamedUpload(path=name, file=SimpleUploadedFile("config.json", b"{}"))])
        assert caught.value.code == "name_too_long"
        message = caught.value.message
    assert "at most 255 bytes" in message and "rename it" in message and len(message) < 300
    _nothing_uploaded(media_root)


@pytest.mark.parametrize("entries, code, says", [
    (["a" * 300 + ".json"], "name_too_long", "at most 255 bytes"),
    (["config.json", "config.json/x.json"], "bad_zip", "both a file and a folder"),
])
def test_it_refuses_zip_entries_that_cannot_be_written(client, key, media_root, entries, code, says):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for entry in entries:
            archive.writestr(entry, b"{}")
    response = _upload(client, key, [SimpleUploadedFile("model.zip", buffer.getvalue())])
    assert says in _error(response, 400, code)
    _nothing_uploaded(media_root)


# -- ids ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("report", ["not-an-id", "0" * 10**4, 12, None, ["x"] * 10**4])
def test_it_refuses_a_deployment_of_a_report_that_is_no_id(client, make_org, make_key, report):
    org = make_org()
    body = {"report": report, "name": "prod"}
    response = client.post("/api/v1/deployments", json.dumps(body), content_type="application/json",
                           **_auth(make_key(org)))
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_id" and error["message"].startswith("report must be an id like "), error
    assert len(error["message"]) < 200  # what was sent is quoted, cut short
    assert Deployment.objects.count() == 0


# -- NUL characters -----------------------------------------------------------------------------


def test_it_refuses_a_nul_character_in_a_body_or_a_query_string(client, make_org, make_key, make_report):
    # PostgreSQL stores no NUL in text or jsonb: each of these failed inside the database (a red
    # team, 2026-12-06); now refused at the door, nothing written.
    org = make_org()
    report = make_report(org)
    key = make_key(org)
    body = {"report": str(report.pk), "name": "pro\x00d"}
    message = _error(client.post("/api/v1/deployments", json.dumps(body), content_type="application/json", **_auth(key)),
                     400, "invalid_text")
    assert "NUL" in message and "$.name" in message
    assert Deployment.objects.count() == 0
    _error(client.post(f"/api/v1/reports/{report.pk}/disputes", json.dumps({"reason": "\x00abc"}),
                       content_type="application/json", **_auth(key)), 400, "invalid_text")
    for path in ("/api/v1/invoices?currency=%00", "/api/v1/invoices?organization=%00", "/api/v1/contracts?organization=%00"):
        assert "NUL" in _error(client.get(path, **_auth(key)), 400, "invalid_text"), path
    # An escaped backslash followed by "u0000" is text like any other.
    from api.bounded import json_object_bounded

    text = json.dumps({"name": "prod \\u0000", "list": ["a\\u0000"]})
    assert json_object_bounded(text, max_bytes=1000, what="a body") == {"name": "prod \\u0000", "list": ["a\\u0000"]}


# -- datetimes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("active_from", [BEYOND_9999, "0001-01-01T00:00:00+01:00", "2150-01-01T00:00:00Z"])
def test_it_refuses_a_deployment_active_from_outside_the_window(client, make_org, make_key, make_report,
                                                                 active_from):
    org = make_org()
    report = make_report(org)
    body = {"report": str(report.pk), "name": "prod", "active_from": active_from}
    response = client.post("/api/v1/deployments", json.dumps(body), content_type="application/json",
                           **_auth(make_key(org)))
    message = _error(response, 400, "invalid_field")
    assert "outside the accepted window 2000-01-01 to 2100-01-01" in message and "check the year" in message
    assert Deployment.objects.count() == 0


def test_it_refuses_usage_timestamps_outside_the_window(client, make_org, make_key, make_report):
    org = make_org()
    deployment = unchecked_deployment(org, make_report(org), name="prod")
    events = [{"idempotency_key": f"k{i}", "deployment": str(deployment.pk), "timestamp": stamp,
               "gpu_hours": "1"} for i, stamp in enumerate([BEYOND_9999, "0001-01-01T00:00:00+01:00", "x" * 10**5])]
    response = client.post("/api/v1/usage/batch", json.dumps({"events": events}), content_type="application/json",
                           **_auth(make_key(org)))
    assert response.status_code == 200, response.content[:500]
    reasons = [r["reason"] for r in response.json()["results"]]
    assert {r["code"] for r in reasons} == {"invalid_timestamp"}
    assert "check the year" in reasons[0]["message"] and "check the year" in reasons[1]["message"]
    assert "at most 64" in reasons[2]["message"] and len(reasons[2]["message"]) < 200
    assert UsageEvent.objects.count() == 0


# -- the error contract under /api/ -------------------------------------------------------------


def test_it_answers_an_unhandled_exception_with_a_json_500_and_logs_the_detail(client, key, monkeypatch, caplog):
    def broken(**kwargs):
        raise RuntimeError("connection to /srv/dyno/secret.sock lost")

    monkeypatch.setattr("api.views.model_list", broken)
    with caplog.at_level(logging.ERROR, logger="api.errors"):
        response = client.get("/api/v1/models", **_auth(key))
    message = _error(response, 500, "internal_error")
    assert "secret" not in message and "RuntimeError" not in message and "incident" in message
    incident = message.split("incident ")[1].split(")")[0]
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert incident in logged and "GET /api/v1/models" in logged
    assert any(r.exc_info and "secret.sock" in str(r.exc_info[1]) for r in caplog.records)


def test_it_answers_request_data_too_big_with_a_json_413(client, key, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024  # what Django itself refuses: form fields past it
    response = client.post("/api/v1/models", {"name": "x" * 5000}, **_auth(key))
    message = _error(response, 413, "request_too_large")
    assert "send less" in message
    assert ModelVersion.objects.count() == 0


@pytest.mark.parametrize("path", ["/api/v1/runs", "/api/v1/usage/batch", "/api/v1/deployments"])
def test_it_refuses_a_json_body_over_the_cap_from_its_content_length(client, key, path):
    body = json.dumps({"model_version": "x", "hardware": "cpu", "pad": "x" * JSON_BODY_MAX_BYTES})
    response = client.post(path, body, content_type="application/json", **_auth(key))
    message = _error(response, 413, "request_too_large")
    assert f"at most {JSON_BODY_MAX_BYTES:,}" in message and "split a batch" in message
    # Declared, not sent: reading the body would fail (the test client holds 2 bytes), so a 413
    # here means it was refused unread.
    response = client.post(path, "{}", content_type="application/json", CONTENT_LENGTH=str(JSON_BODY_MAX_BYTES + 1),
                           **_auth(key))
    _error(response, 413, "request_too_large")
    assert Run.objects.count() == 0


@pytest.mark.parametrize("path", ["/api/v1/runs/not-a-uuid", "/api/v1/models/123/../../etc", "/api/v2/runs",
                                  "/api/nothing"])
def test_it_answers_an_unknown_api_path_or_a_non_uuid_id_with_json_404(client, key, path):
    message = _error(client.get(path, **_auth(key)), 404, "not_found")
    assert "openapi.json" in message and "UUIDs" in message
    assert client.post(path, "{}", content_type="application/json").status_code == 404  # no CSRF page


def test_it_answers_a_missing_object_with_json_404(client, key):
    message = _error(client.get("/api/v1/runs/0f8c2d1e-5b7a-4c1e-9a3b-2d4e6f8a0b1c", **_auth(key)), 404, "not_found")
    assert "No such object" in message


def test_it_answers_a_wrong_method_with_json_405_and_allow(client, key):
    response = client.delete("/api/v1/models", **_auth(key))
    assert "GET or POST" in _error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET, POST"


def test_it_answers_a_refused_host_under_api_with_json_400(key):
    response = Client().get("/api/v1/models", HTTP_HOST="attacker.example", **_auth(key))
    _error(response, 400, "bad_request")


def test_its_handlers_answer_json_under_api_and_html_elsewhere():
    factory = RequestFactory()
    api, page = factory.get("/api/v1/models"), factory.get("/reports/")
    _error(errors.server_error(api), 500, "internal_error")
    _error(errors.page_not_found(api, Exception("/srv/path tried")), 404, "not_found")
    _error(errors.permission_denied(api, Exception()), 403, "forbidden")
    from django.core.exceptions import RequestDataTooBig
    _error(errors.bad_request(api, RequestDataTooBig("x")), 413, "request_too_large")
    for response in (errors.server_error(page), errors.page_not_found(page, Exception("x"))):
        assert response["Content-Type"].startswith("text/html")
    assert Client().get("/no-such-page").status_code == 404
    assert Client().get("/no-such-page")["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("body, says", [
    ('{"model_version": NaN, "hardware": "cpu"}', "NaN"),
    ('{"batch": 1e999}', "too large"),
    ('{"batch": ' + "9" * 5000 + "}", "digits"),
    ('{"hardware": "cpu",', "line 1, column 20"),
    (b'{"hardware": "\xff"}', "not UTF-8"),
    ("[1, 2]", "must be a JSON object"),
])
def test_it_refuses_json_that_is_not_strict_json_without_internals(client, key, body, says):
    response = client.post("/api/v1/runs", body, content_type="application/json", **_auth(key))
    message = _error(response, 400)
    assert says in message and "set_int_max_str_digits" not in message
    assert Run.objects.count() == 0


# -- sizes before bodies ------------------------------------------------------------------------


def test_it_refuses_a_20_mib_audit_candidate_before_reading_it(client, key, monkeypatch):
    _refuse_reading(monkeypatch)
    candidate = SimpleUploadedFile("candidate.py", b"x = 1\n" * (20 * 2**20 // 6))
    response = client.post("/api/v1/audits", {"workload": "rmsnorm", "candidate": candidate}, **_auth(key))
    message = _error(response, 413, "candidate_too_large")
    assert "256 KiB" in message and "Keep generated tables out" in message
    assert Run.objects.count() == 0


def test_it_refuses_an_audit_candidate_file_over_256_kib_before_reading_it(client, key):
    candidate = SimpleUploadedFile("candidate.py", b"x = 1\n" * (MAX_CANDIDATE_BYTES // 6 + 100))
    response = client.post("/api/v1/audits", {"workload": "rmsnorm", "candidate": candidate}, **_auth(key))
    message = _error(response, 413, "candidate_too_large")
    assert message.startswith("The candidate file is") and "256 KiB" in message
    assert Run.objects.count() == 0


def test_the_verify_page_refuses_big_uploads_before_reading_them(client, monkeypatch):
    _refuse_reading(monkeypatch)
    response = client.post("/verify", {"report": SimpleUploadedFile("report.json", b" " * (3 * 2**20)),
                                       "signature": SimpleUploadedFile("report.sig.json", b"{}")})
    assert response.status_code == 413
    assert "at most 1 MiB each" in response.content.decode()


def test_the_verify_page_caps_each_file_at_1_mib(client):
    response = client.post("/verify", {"report": SimpleUploadedFile("report.json", b" " * (2**20 + 1)),
                                       "signature": SimpleUploadedFile("report.sig.json", b"{}")})
    assert response.status_code == 413
    page = response.content.decode()
    assert "The report file is 1,048,577 bytes" in page and "at most 1 MiB" in page


# -- no internals in customer-visible messages --------------------------------------------------


def test_upload_refusals_carry_no_server_paths_or_exception_text(client, key, media_root):
    response = _upload(client, key, [SimpleUploadedFile("model.zip", b"PK\x03\x04 not really a zip")])
    message = _error(response, 400, "bad_zip")
    assert str(media_root) not in message and "staging" not in message and "Errno" not in message
    assert "re-create it" in message
    _nothing_uploaded(media_root)


@pytest.mark.parametrize("card", [
    {"model_type": "bart", "architectures": ["BartModel"], "encoder_layers": 1500, "decoder_layers": 1500},
    {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 700, "n_layers": 700},
])
def test_it_refuses_a_card_with_too_many_layers_whatever_the_keys_are_called(client, key, media_root, card):
    started = time.monotonic()
    response = _upload(client, key, [SimpleUploadedFile("config.json", json.dumps(card).encode())])
    message = _error(response, 400, "invalid_config")
    assert "layers in all" in message and "more than 1024 layers" in message
    assert time.monotonic() - started < 5.0  # refused before any module is built
    _nothing_uploaded(media_root)
