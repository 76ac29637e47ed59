"""Auditors and customers acting on reports: side-by-side comparison, re-audit requests, disputes
inside the window, the pipeline's re-audit report superseding the old one, and the audit log."""

from __future__ import annotations

import functools
from io import StringIO
import json
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from accounts.selectors import actor_for_user
from auditlog.models import AuditEvent
from auditlog.services import audit_verify_chain
from reports.models import Dispute, ReauditRequest
from reports.selectors import reaudit_requests_pending, report_verify
from reports.services import (
    ReportRefused,
    reaudit_claim,
    reaudit_fail,
    reaudit_request,
    report_create_for_run,
    report_dispute,
)
from tests.reports.builders import pdf_text, signed_in, synthetic_result

pytestmark = pytest.mark.django_db


def _actor(email: str):
    from django.contrib.auth import get_user_model

    return actor_for_user(get_user_model().objects.get(username=email))


def test_an_auditor_compares_two_reports_side_by_side(client, people, make_report):
    acme = people["acme"]
    before = make_report(acme)
    after = make_report(acme, result=synthetic_result(
        seed=11, speedups={"rmsnorm": 1.60, "gemm": 1.30, "attention_prefill": 0.98},
        environment={"device": "cpu", "cpu": "AMD EPYC 9454 (2 cores)", "torch": "2.14.0"}))
    signed_in(client, "auditor@audit.test")
    page = client.get(f"/reports/compare?a={after.pk}&b={before.pk}").content.decode()
    assert "some new figures lie outside the older 95% CI" in page
    assert "torch" in page and "2.14.0" in page and "2.13.0" in page
    assert "0.260 (25.0%)" in page  # gemm: 1.04x -> 1.30x
    assert client.get("/reports/compare?a=nonsense&b=x").status_code == 404


def test_an_auditor_requests_a_reaudit_and_a_customer_may_not(client, people, make_report):
    report = make_report(people["acme"])
    signed_in(client, "auditor@audit.test")
    response = client.post(f"/reports/{report.pk}/reaudit", {"reason": "driver updated to 560.35"})
    assert response.status_code == 302
    request = ReauditRequest.objects.get(report=report)
    assert request.status == "requested" and request.reason == "driver updated to 560.35"
    assert request.requested_by.endswith("auditor@audit.test")
    assert list(reaudit_requests_pending()) == [request]
    # A second request joins the open one instead of queueing a duplicate measurement.
    again = reaudit_request(actor=_actor("staff@dyno.test"), report=report, reason="and again")
    assert again.pk == request.pk
    with pytest.raises(ReportRefused) as refused:
        reaudit_request(actor=_actor("owner@acme.test"), report=report, reason="please")
    assert refused.value.code == "forbidden" and "dispute" in refused.value.message
    with pytest.raises(ReportRefused, match="say why"):
        reaudit_request(actor=_actor("auditor@audit.test"), report=report, reason="  ")
    event = AuditEvent.objects.get(action="reaudit.requested")
    assert event.data["reason"] == "driver updated to 560.35" and event.organization_id == people["acme"].pk


def test_a_customer_disputes_inside_the_window_only(people, make_report, settings):
    report = make_report(people["acme"])
    dispute = report_dispute(actor=_actor("finance@acme.test"), report=report, reason="gemm figure looks high")
    assert dispute.status == "open" and dispute.reaudit.status == "requested"
    assert dispute.reaudit.reason == "dispute: gemm figure looks high"
    assert AuditEvent.objects.filter(action="report.disputed", data__dispute=str(dispute.pk)).exists()
    with pytest.raises(ReportRefused) as refused:
        report_dispute(actor=_actor("auditor@audit.test"), report=report, reason="x")
    assert refused.value.code == "forbidden"
    settings.DYNO_REPORT_DISPUTE_DAYS = 30
    old = make_report(people["acme"], result=synthetic_result(seed=21))
    # Reports are immutable in the database, so move the clock rather than created_at.
    with mock.patch("reports.services.timezone.now", return_value=timezone.now() + timedelta(days=31)), \
            pytest.raises(ReportRefused) as late:
        report_dispute(actor=_actor("owner@acme.test"), report=old, reason="too late")
    assert late.value.code == "window_closed" and "30-day" in late.value.message
    with mock.patch("reports.services.timezone.now", return_value=timezone.now() + timedelta(days=29)):
        assert report_dispute(actor=_actor("owner@acme.test"), report=old, reason="in time").status == "open"


def test_the_pipelines_reaudit_report_supersedes_and_resolves_the_dispute(client, people, make_report, make_run):
    acme = people["acme"]
    original = make_report(acme)
    dispute = report_dispute(actor=_actor("owner@acme.test"), report=original, reason="numbers too good")
    request = dispute.reaudit
    rerun = make_run(acme, version=original.run.model_version, result=synthetic_result(seed=5, model=(1.28, 1.2, 1.35)))
    assert reaudit_claim(request_id=request.pk, run=rerun)
    assert not reaudit_claim(request_id=request.pk, run=rerun)  # a second worker finds it claimed
    new = report_create_for_run(run=rerun)
    assert new.kind == "reaudit" and new.supersedes_id == original.pk
    body = json.loads(new.body_bytes)
    assert body["supersedes"]["report_id"] == str(original.pk)
    assert body["supersedes"]["report_sha256"] == original.body_sha256
    assert body["supersedes"]["reason"] == "dispute: numbers too good"
    request.refresh_from_db()
    dispute.refresh_from_db()
    assert request.status == "completed" and request.result_report_id == new.pk
    assert dispute.status == "resolved" and dispute.resolved_at is not None
    assert report_verify(report=new).valid and report_verify(report=original).valid
    signed_in(client, "member@acme.test")
    page = client.get(f"/reports/{original.pk}").content.decode()
    assert "Superseded by the re-audit" in page
    assert "supersedes" in client.get(f"/reports/{new.pk}").content.decode()
    # A re-audit of the old report again supersedes the newest report of the chain, never forks it.
    second = reaudit_request(actor=_actor("auditor@audit.test"), report=original, reason="once more")
    rerun2 = make_run(acme, version=original.run.model_version, result=synthetic_result(seed=6))
    assert reaudit_claim(request_id=second.pk, run=rerun2)
    assert report_create_for_run(run=rerun2).supersedes_id == new.pk
    assert {"report.created", "reaudit.requested", "reaudit.started", "reaudit.completed", "report.disputed"} <= set(
        AuditEvent.objects.values_list("action", flat=True))
    assert audit_verify_chain().ok


def test_a_failed_reaudit_is_recorded_and_the_dispute_stays_open(people, make_report):
    report = make_report(people["acme"])
    dispute = report_dispute(actor=_actor("member@acme.test"), report=report, reason="check it")
    assert reaudit_fail(request_id=dispute.reaudit_id, error="no cpu runner online")
    dispute.refresh_from_db()
    assert dispute.reaudit.status == "failed" and dispute.status == "open"
    # The failed request no longer blocks a new one.
    assert reaudit_request(actor=_actor("auditor@audit.test"), report=report, reason="retry").pk != dispute.reaudit_id


def test_the_api_takes_disputes_and_reaudit_requests(client, people, make_report, make_key):
    report = make_report(people["acme"])
    customer = {"HTTP_AUTHORIZATION": f"Bearer {make_key(people['acme'], 'customer')}"}
    auditor = {"HTTP_AUTHORIZATION": f"Bearer {make_key(people['acme'], 'auditor')}"}
    url = f"/api/v1/reports/{report.pk}"
    created = client.post(f"{url}/disputes", {"reason": "too good"}, content_type="application/json", **customer)
    assert created.status_code == 201 and Dispute.objects.get(pk=created.json()["id"]).reason == "too good"
    post = functools.partial(client.post, content_type="application/json")
    assert post(f"{url}/disputes", {"reason": "x"}, **auditor).status_code == 403
    assert post(f"{url}/reaudit", {"reason": "x"}, **customer).status_code == 403
    reaudit = client.post(f"{url}/reaudit", {"reason": "driver"}, content_type="application/json", **auditor)
    assert reaudit.status_code == 201 and reaudit.json()["id"] == created.json()["reaudit"]
    assert client.post(f"{url}/reaudit", {}, content_type="application/json", **auditor).status_code == 400


def test_a_dispute_stands_when_the_broker_refuses_its_re_audit_whatever_the_transport_raises(
        client, people, make_report, make_key, monkeypatch, django_capture_on_commit_callbacks, caplog):
    # Found by the API fuzzer: the filesystem transport raised FileNotFoundError, not kombu's
    # OperationalError, so a committed dispute was answered with a 500. The reports sweep queues it.
    def refuse(*args, **kwargs):
        raise FileNotFoundError("no broker folder")

    monkeypatch.setattr("dyno.dispatch.send", refuse)
    report = make_report(people["acme"])
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"/api/v1/reports/{report.pk}/disputes", {"reason": "too good"}, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {make_key(people['acme'], 'customer')}")
    assert answer.status_code == 201 and Dispute.objects.filter(pk=answer.json()["id"]).exists()
    assert "not queued" in caplog.text and "the reports sweep will do it" in caplog.text


def test_the_pdf_carries_the_model_name_and_the_signed_files(client, people, make_report):
    report = make_report(people["acme"])
    signed_in(client, "auditor@audit.test")
    response = client.get(f"/reports/{report.pk}/report.pdf")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    pdf = response.content
    assert pdf.startswith(b"%PDF")
    text = pdf_text(pdf)
    assert b"llama-tiny" in text
    assert report.body_bytes in text  # the signed JSON rides along as an attachment, byte for byte


def test_the_signing_key_command_lists_rotates_and_revokes(people, make_report):

    from django.core.management import CommandError, call_command

    report = make_report(people["acme"])
    out = StringIO()
    call_command("signing_key", "list", stdout=out)
    assert report.key_id in out.getvalue() and "active" in out.getvalue()
    call_command("signing_key", "rotate", stdout=out)
    call_command("signing_key", "revoke", report.key_id, "--reason", "test", stdout=out)
    listing = StringIO()
    call_command("signing_key", "list", stdout=listing)
    assert f"{report.key_id}  revoked" in listing.getvalue()
    with pytest.raises(CommandError, match="no signing key"):
        call_command("signing_key", "revoke", "ffff", "--reason", "x")
    assert AuditEvent.objects.filter(action="signing_key.rotated", actor="operator:manage.py signing_key").exists()


def test_the_contract_in_force_sets_the_dispute_window(people, make_report):
    from metering.contracts import contract_terms_from, contract_version_create
    from tests.metering.conftest import TERMS

    first = timezone.localdate().replace(day=1)
    contract_version_create(organization=people["acme"], terms=contract_terms_from({**TERMS, "dispute_window_days": 5}),
                            effective_from=first, actor="system:test", today=first)
    report = make_report(people["acme"], result=synthetic_result(seed=22))
    with mock.patch("reports.services.timezone.now", return_value=timezone.now() + timedelta(days=6)), \
            pytest.raises(ReportRefused) as late:
        report_dispute(actor=_actor("owner@acme.test"), report=report, reason="after the contract's window")
    assert late.value.code == "window_closed" and "5-day" in late.value.message
    with mock.patch("reports.services.timezone.now", return_value=timezone.now() + timedelta(days=4)):
        assert report_dispute(actor=_actor("owner@acme.test"), report=report, reason="in time").status == "open"


def _complete(request, make_run, org, seed: int):
    """The pipeline's part: a run measures the request again and its report supersedes."""
    rerun = make_run(org, result=synthetic_result(seed=seed))
    assert reaudit_claim(request_id=request.pk, run=rerun)
    return report_create_for_run(run=rerun)


def test_a_dispute_re_measures_a_report_once(client, people, make_report, make_run):
    acme = people["acme"]
    report = make_report(acme)
    first = report_dispute(actor=_actor("owner@acme.test"), report=report, reason="figure too high")
    # A second dispute while the first is open joins it: nothing more is measured.
    joined = report_dispute(actor=_actor("finance@acme.test"), report=report, reason="agree")
    assert joined.reaudit_id == first.reaudit_id
    # One open dispute per person: the same owner again adds nothing.
    with pytest.raises(ReportRefused) as again:
        report_dispute(actor=_actor("owner@acme.test"), report=report, reason="louder")
    assert again.value.code == "limit_reached" and f"dispute {first.pk}" in again.value.message
    new = _complete(first.reaudit, make_run, acme, seed=31)
    # Neither the re-audit report nor the old one can be disputed into a second measurement.
    for target in (new, report):
        with pytest.raises(ReportRefused) as refused:
            report_dispute(actor=_actor("owner@acme.test"), report=target, reason="still too high")
        assert refused.value.code == "limit_reached" and "re-measures once" in refused.value.message
    customer = {"HTTP_AUTHORIZATION": f"Bearer {make_key_for(acme, 'customer')}"}
    response = client.post(f"/api/v1/reports/{new.pk}/disputes", {"reason": "again"},
                           content_type="application/json", **customer)
    assert response.status_code == 409 and response.json()["error"]["code"] == "limit_reached"
    # Dyno's operator can still have it measured again.
    assert reaudit_request(actor=_actor("staff@dyno.test"), report=new, reason="operator review").by_operator


def test_a_reaudit_that_proved_nothing_does_not_spend_the_dispute(people, make_report, make_run):
    # Red team 16 (2026-12-06): a re-audit whose A/A control was unstable resolved the dispute and
    # counted as its one re-measurement, so the contested figure billed on with no dispute left.
    acme = people["acme"]
    report = make_report(acme)
    first = report_dispute(actor=_actor("owner@acme.test"), report=report, reason="figure too high")
    rerun = make_run(acme, result=synthetic_result(seed=32, stable=False))
    assert reaudit_claim(request_id=first.reaudit_id, run=rerun)
    unstable = report_create_for_run(run=rerun)
    assert not unstable.stable and unstable.supersedes_id == report.pk
    second = report_dispute(actor=_actor("owner@acme.test"), report=report, reason="still too high")
    assert second.reaudit_id != first.reaudit_id
    remeasured = _complete(second.reaudit, make_run, acme, seed=33)
    assert remeasured.stable and remeasured.supersedes_id == unstable.pk
    # That re-audit measured: the chain's one dispute is spent now.
    for target in (report, remeasured):
        with pytest.raises(ReportRefused) as refused:
            report_dispute(actor=_actor("owner@acme.test"), report=target, reason="again")
        assert refused.value.code == "limit_reached"


def make_key_for(org, scope: str) -> str:
    from accounts.services import api_key_create

    return api_key_create(organization=org, scope=scope, name=f"{scope}-key", operator=True)[1]


def test_remeasurements_are_limited_per_contract_window(client, people, make_report, make_run, settings):
    settings.DYNO_REAUDITS_PER_WINDOW = 2
    acme = people["acme"]
    reports = [make_report(acme, result=synthetic_result(seed=40 + i)) for i in range(4)]
    auditor = _actor("auditor@audit.test")
    done = reaudit_request(actor=auditor, report=reports[0], reason="one")
    _complete(done, make_run, acme, seed=50)
    failed = report_dispute(actor=_actor("owner@acme.test"), report=reports[1], reason="two")
    assert reaudit_fail(request_id=failed.reaudit_id, error="no runner")  # measured nothing: not counted
    reaudit_request(actor=auditor, report=reports[2], reason="three")  # open: counted
    with pytest.raises(ReportRefused) as refused:
        reaudit_request(actor=auditor, report=reports[3], reason="four")
    assert refused.value.code == "limit_reached" and "re-measured 2 times in the last 30 days" in refused.value.message
    with pytest.raises(ReportRefused):
        report_dispute(actor=_actor("owner@acme.test"), report=reports[1], reason="two, again")
    key = {"HTTP_AUTHORIZATION": f"Bearer {make_key_for(acme, 'auditor')}"}
    response = client.post(f"/api/v1/reports/{reports[3].pk}/reaudit", {"reason": "four"},
                           content_type="application/json", **key)
    assert response.status_code == 409 and "Dyno's operator" in response.json()["error"]["message"]
    # The operator is not counted, and joining the open request measures nothing new.
    assert reaudit_request(actor=_actor("staff@dyno.test"), report=reports[3], reason="operator").by_operator
    assert reaudit_request(actor=auditor, report=reports[2], reason="join").reason == "three"
    # The window rolls: a month on, the organization's auditors may ask again.
    with mock.patch("reports.services.timezone.now", return_value=timezone.now() + timedelta(days=31)):
        assert reaudit_request(actor=auditor, report=reports[1], reason="next window").status == "requested"
    assert ReauditRequest.objects.filter(organization=acme, by_operator=False).count() == 4


def test_a_report_lists_the_auditors_the_operator_appointed(client, people, make_report):
    from accounts.models import ApiKey
    from accounts.services import AccountError, api_key_create, member_add

    acme = people["acme"]
    report = make_report(acme)
    api_key_create(organization=acme, scope="auditor", name="audit-firm-ci", operator=True)
    revoked, _ = api_key_create(organization=acme, scope="auditor", name="old-firm", operator=True)
    ApiKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    with pytest.raises(AccountError, match="granted by Dyno's operators"):
        api_key_create(organization=acme, scope="auditor", name="self-appointed")
    with pytest.raises(AccountError, match="appointed by Dyno's operators"):
        member_add(organization=acme, email="friend@acme.test", role="auditor")
    signed_in(client, "member@acme.test")
    page = client.get(f"/reports/{report.pk}").content.decode()
    assert "auditor@audit.test" in page and "audit-firm-ci" in page
    assert "old-firm" not in page and "auditor@other.test" not in page  # revoked; another organization's
    customer = {"HTTP_AUTHORIZATION": f"Bearer {make_key_for(acme, 'customer')}"}
    listed = client.get("/api/v1/reports", **customer).json()["reports"][0]["auditors"]
    assert [(a["kind"], a["label"].split(" ")[0]) for a in listed] == [("person", "auditor@audit.test"),
                                                                        ("key", "audit-firm-ci")]


def test_the_operator_appoints_auditors_who_are_not_the_customer(people):
    from django.core.management import CommandError, call_command

    from accounts.models import Membership

    call_command("appoint_auditor", "acme", "Firm@Audit.test", stdout=StringIO())
    assert Membership.objects.get(organization=people["acme"], user__username="firm@audit.test").role == "auditor"
    with pytest.raises(CommandError, match="own people cannot audit"):
        call_command("appoint_auditor", "acme", "finance@acme.test")
    assert Membership.objects.get(organization=people["acme"], user__username="finance@acme.test").role == "finance"
    with pytest.raises(CommandError, match="no organization"):
        call_command("appoint_auditor", "nope", "x@y.test")


def test_a_stored_reaudit_report_moves_the_deployment_with_no_one_switching(people, make_report, make_run, client):
    """The chain on PostgreSQL: deploy a report's artifact; another run's report is refused; an
    auditor's re-audit, once its report is stored, is what the deployment bills under from its date."""
    from metering.contracts import contract_terms_from, contract_version_create
    from metering.deployments import deployment_create
    from metering.errors import BillingError
    from tests.metering.conftest import TERMS

    acme = people["acme"]
    first = timezone.localdate().replace(day=1)
    contract_version_create(organization=acme, terms=contract_terms_from(
        {**TERMS, "prices": {"cpu": "1.00"}, "measurement_plan": {"suite_version": "1.0.0", "baseline": "eager"}}),
        effective_from=first, actor="system:test", today=first)
    original = make_report(acme, result=synthetic_result(seed=60, model=(1.3, 1.2, 1.4)))
    owner = _actor("owner@acme.test")
    deployment = deployment_create(actor=owner, organization=acme, report=original, name="prod")
    other = make_report(acme, result=synthetic_result(seed=61, stable=False))
    with pytest.raises(BillingError) as refused:
        deployment_create(actor=owner, organization=acme, report=other, name="cheap")
    assert refused.value.code == "report_unstable"

    request = reaudit_request(actor=_actor("auditor@audit.test"), report=original, reason="quarterly re-audit")
    rerun = make_run(acme, version=original.run.model_version, result=synthetic_result(seed=62, model=(1.25, 1.15, 1.3)))
    assert reaudit_claim(request_id=request.pk, run=rerun)
    new = report_create_for_run(run=rerun)
    history = list(deployment.report_history.order_by("effective_from").values_list("report_id", "effective_from"))
    assert history == [(original.pk, deployment.active_from), (new.pk, new.created_at)]
    assert AuditEvent.objects.filter(action="deployment.report_switched", actor="system:reaudit").exists()


def test_open_disputes_of_a_report_are_capped(people, make_report, settings):
    from reports.models import Dispute

    settings.DYNO_DISPUTES_PER_REPORT = 1
    report = make_report(people["acme"])
    report_dispute(actor=_actor("owner@acme.test"), report=report, reason="figure too high")
    with pytest.raises(ReportRefused) as refused:
        report_dispute(actor=_actor("finance@acme.test"), report=report, reason="me too")
    assert refused.value.code == "limit_reached" and "1 open disputes" in refused.value.message
    assert Dispute.objects.filter(report=report).count() == 1


def test_every_report_answer_is_what_the_document_says(client, people, make_report, make_run):
    """Each answer validates against its schema in /api/v1/openapi.json (additionalProperties:
    false throughout, so nothing undocumented), a re-audit's comparison and changed environment
    included; the body is the signed bytes, which the document calls an object."""
    import jsonschema

    document = client.get("/api/v1/openapi.json").json()

    def conforms(path: str, method: str, status: int, answer) -> None:
        assert answer.status_code == status, answer.content
        schema = document["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]
        jsonschema.Draft202012Validator({**schema, "components": document["components"]}).validate(answer.json())

    acme = people["acme"]
    original = make_report(acme)
    customer = {"HTTP_AUTHORIZATION": f"Bearer {make_key_for(acme, 'customer')}"}
    auditor = {"HTTP_AUTHORIZATION": f"Bearer {make_key_for(acme, 'auditor')}"}
    post = functools.partial(client.post, content_type="application/json")
    url = f"/api/v1/reports/{original.pk}"
    conforms("/reports/{report_id}/disputes", "post", 201, post(f"{url}/disputes", {"reason": "too good"}, **customer))
    conforms("/reports/{report_id}/reaudit", "post", 201, post(f"{url}/reaudit", {"reason": "driver"}, **auditor))
    rerun = make_run(acme, result=synthetic_result(seed=31, environment={
        "device": "cpu", "cpu": "AMD EPYC 9454 (2 cores)", "torch": "2.14.0", "threads": 2, "clock_ghz": 2.75,
        "turbo": False, "flags": ["avx512"], "numa": {"nodes": 1}}))
    assert reaudit_claim(request_id=ReauditRequest.objects.get(report=original).pk, run=rerun)
    new = report_create_for_run(run=rerun)
    ReauditRequest.objects.create(organization=acme, report=new, requested_by="x", reason="failed one",
                                  status="failed", error="no runner")
    for report, key in ((original, customer), (new, auditor)):
        answer = client.get(f"/api/v1/reports/{report.pk}/reaudit", **key)
        conforms("/reports/{report_id}/reaudit", "get", 200, answer)
        comparison = answer.json()["superseded_by" if report == original else "supersedes"]
        assert comparison["figures"] and comparison["original"] == str(original.pk)
        assert {c["key"] for c in comparison["environment_changes"]} >= {"torch", "threads", "flags", "numa.nodes"}
    conforms("/reports", "get", 200, client.get("/api/v1/reports", **customer))
    conforms("/reports/{report_id}/signature", "get", 200, client.get(f"{url}/signature", **auditor))
    body = client.get(url, **auditor)
    assert body.content == original.body_bytes and body["X-Dyno-Body-Sha256"] == original.body_sha256
    conforms("/reports/{report_id}", "get", 200, body)
    for refused in (post(f"{url}/reaudit", {"reason": " "}, **auditor), post(f"{url}/disputes", {}, **customer)):
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_reason"
