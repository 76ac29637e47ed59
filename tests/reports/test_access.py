"""Who sees a report: its organization's members, its assigned auditors and staff; a 404 for
everyone else, on the web and through the API."""

from __future__ import annotations

import json
import re

import pytest

from tests.reports.builders import signed_in, synthetic_result

pytestmark = pytest.mark.django_db

REPORT_PAGES = ("/reports/{id}", "/reports/{id}/report.json", "/reports/{id}/signature.json")


@pytest.mark.parametrize("email", ["owner@acme.test", "member@acme.test", "finance@acme.test",
                                   "auditor@audit.test", "staff@dyno.test"])
def test_it_shows_a_report_to_its_org_its_auditors_and_staff(client, people, make_report, email):
    report = make_report(people["acme"])
    signed_in(client, email)
    for page in REPORT_PAGES:
        response = client.get(page.format(id=report.pk))
        assert response.status_code == 200, (page, response.status_code)
    assert client.get(f"/reports/{report.pk}/report.json").content == report.body_bytes
    listing = client.get("/reports/").content.decode()
    assert str(report.pk) in listing


@pytest.mark.parametrize("email", ["owner@globex.test", "auditor@other.test"])
def test_it_answers_404_to_other_orgs_and_their_auditors(client, people, make_report, email):
    report = make_report(people["acme"])
    signed_in(client, email)
    for page in (*REPORT_PAGES, "/reports/{id}/report.pdf"):
        assert client.get(page.format(id=report.pk)).status_code == 404, page
    assert str(report.pk) not in client.get("/reports/").content.decode()
    mine = make_report(people["globex"], name="globex-model") if email.startswith("owner") else None
    compare = client.get(f"/reports/compare?a={report.pk}&b={(mine or report).pk}")
    assert compare.status_code == 404
    assert client.post(f"/reports/{report.pk}/dispute", {"reason": "x"}).status_code == 404
    assert client.post(f"/reports/{report.pk}/reaudit", {"reason": "x"}).status_code == 404


def test_it_sends_signed_out_visitors_to_sign_in(client, people, make_report):
    report = make_report(people["acme"])
    response = client.get(f"/reports/{report.pk}")
    assert response.status_code == 302 and "/signin" in response["Location"]
    assert client.get(f"/reports/{report.pk}/report.json").status_code == 302


def _bearer(raw: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


@pytest.mark.parametrize("scope", ["customer", "auditor"])
def test_the_api_serves_the_exact_signed_bytes_to_customer_and_auditor_keys(client, people, make_report,
                                                                           make_key, scope):
    report = make_report(people["acme"])
    key = _bearer(make_key(people["acme"], scope))
    response = client.get(f"/api/v1/reports/{report.pk}", **key)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.content == report.body_bytes
    signature = client.get(f"/api/v1/reports/{report.pk}/signature", **key).json()
    assert signature == {"key_id": report.key_id, "algorithm": "ed25519", "signature": report.signature}
    listed = client.get("/api/v1/reports", **key).json()["reports"]
    assert [r["id"] for r in listed] == [str(report.pk)]
    assert listed[0]["model_ci_low"] == "1.220000"


def test_the_api_answers_404_to_another_orgs_keys_and_403_to_finance_keys(client, people, make_report, make_key):
    report = make_report(people["acme"])
    for scope in ("customer", "auditor"):
        other = _bearer(make_key(people["globex"], scope))
        for path in (f"/api/v1/reports/{report.pk}", f"/api/v1/reports/{report.pk}/signature"):
            response = client.get(path, **other)
            assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
        assert client.get("/api/v1/reports", **other).json() == {"reports": [], "next": None}
    finance = client.get(f"/api/v1/reports/{report.pk}", **_bearer(make_key(people["acme"], "finance")))
    assert finance.status_code == 403
    assert client.get(f"/api/v1/reports/{report.pk}").status_code == 401


def test_the_keys_document_is_public(client, people, make_report):
    report = make_report(people["acme"])
    response = client.get("/.well-known/dyno-report-keys.json")
    assert response.status_code == 200
    keys = json.loads(response.content)["keys"]
    assert keys == [{"key_id": report.key_id, "algorithm": "ed25519", "public_key": keys[0]["public_key"],
                     "status": "active"}]


def test_the_report_page_shows_the_figures_and_serves_plotly_locally(client, people, make_report):
    report = make_report(people["acme"])
    signed_in(client, "member@acme.test")
    page = client.get(f"/reports/{report.pk}").content.decode()
    for text in ("llama-tiny v1", "1.2200x", "signature valid", "torch.compile", "rmsnorm", "id=\"report-charts\"",
                 "python -m runners model-audit --model model --artifact artifact.json", "AMD EPYC 9454",
                 f'href="/runs/{report.run_id}/artifact.json"'):
        assert text in page, text
    # No script or style from elsewhere (a bare "cdn" also matched a random CSRF token once).
    assert not re.search(r'<(script|link)[^>]+(src|href)="(https?:)?//', page), "an asset from another host"
    import plotly

    script = client.get(f"/reports/assets/plotly-{plotly.__version__}.min.js")
    assert script.status_code == 200 and script["Content-Type"].startswith("text/javascript")
    assert b"plotly" in b"".join(script.streaming_content)[:2000].lower()
    assert client.get("/reports/assets/plotly-0.0.1.min.js").status_code == 404


def test_the_report_page_says_an_unstable_run_is_not_billable(client, people, make_report):
    report = make_report(people["acme"], result=synthetic_result(stable=False))
    signed_in(client, "owner@acme.test")
    page = client.get(f"/reports/{report.pk}").content.decode()
    assert "not billable" in page and "A/A control" in page and ">unstable<" in page
    assert "Dispute this report" in page and "Request a re-audit" not in page


def test_the_report_operations_are_documented_under_their_api_names(client):
    from django.urls import resolve

    paths = client.get("/api/v1/openapi.json").json()["paths"]
    names = {"/reports": ({"get"}, "reports"), "/reports/{report_id}": ({"get"}, "report-body"),
             "/reports/{report_id}/signature": ({"get"}, "report-signature"),
             "/reports/{report_id}/reaudit": ({"get", "post"}, "report-reaudit"),
             "/reports/{report_id}/disputes": ({"post"}, "report-disputes")}
    for template, (methods, name) in names.items():
        assert set(paths[template]) == methods, template
        match = resolve("/api/v1" + template.replace("{report_id}", "0f8c0000-0000-4000-8000-000000000000"))
        assert (match.namespace, match.url_name) == ("api", name), template
