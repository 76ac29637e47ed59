"""Deployments follow re-audits: the new report applies from its date, never inside a billed month,
and the history of which report applied from when is kept (append-only)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from tests.metering.conftest import TERMS, at

pytestmark = pytest.mark.django_db


def test_it_switches_deployments_to_a_reaudit_from_the_reports_date(make_org, make_contract, make_report,
                                                                     make_deployment, billing_settings):
    from metering.deployments import deployments_follow_reaudit
    from metering.models import DeploymentReport

    org = make_org("acme")
    make_contract(org)
    original = make_report(org, ci_low="1.3")
    deployment = make_deployment(org, original, name="prod")
    untouched = make_deployment(org, make_report(org), name="other")
    reaudit = make_report(org, ci_low="1.1", supersedes=original)
    switched = deployments_follow_reaudit(report=reaudit, actor="system:test")
    assert [s.deployment_id for s in switched] == [deployment.pk]
    history = list(deployment.report_history.order_by("effective_from").values_list("report_id", "effective_from"))
    assert history == [(original.pk, at("2025-01-01 00:00")), (reaudit.pk, reaudit.created_at)]
    assert untouched.report_history.count() == 1
    assert deployments_follow_reaudit(report=reaudit) == []  # already switched: nothing to do
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        DeploymentReport.objects.filter(deployment=deployment).update(effective_from=at("2025-01-02 00:00"))


def test_it_never_moves_a_report_switch_into_a_billed_month(make_org, make_contract, make_report, make_deployment,
                                                            billing_settings):
    from metering.billing import billing_run_create
    from metering.deployments import deployment_switch_report
    from metering.periods import Period

    org = make_org("acme")
    make_contract(org)
    original = make_report(org)
    deployment = make_deployment(org, original, name="prod")
    billing_run_create(period=Period(2025, 1), actor="system:test")
    switch = deployment_switch_report(actor="system:test", deployment=deployment,
                                      report=make_report(org, supersedes=original),
                                      effective_from=at("2025-01-20 00:00"))
    assert switch.effective_from == at("2025-02-01 00:00")


def test_it_refuses_a_second_run_or_invoice_for_the_same_period_in_the_database(billed):
    from metering.models import BillingRun, Invoice

    invoice = billed["acme"]
    with pytest.raises(IntegrityError), transaction.atomic():
        BillingRun.objects.create(period=invoice.period, cutoff=invoice.run.cutoff)
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.create(organization=invoice.organization, run=invoice.run, period=invoice.period,
                               currency=invoice.currency, total=0)


def test_a_reaudit_that_cannot_bill_leaves_the_figure_in_force_and_says_why(make_org, make_contract, make_report,
                                                                          make_deployment, billing_settings):
    from auditlog.models import AuditEvent
    from metering.deployments import deployments_follow_reaudit

    org = make_org("acme")
    make_contract(org)
    original = make_report(org, ci_low="1.3")
    deployment = make_deployment(org, original, name="prod")
    unstable = make_report(org, ci_low="1.01", stable=False, supersedes=original)
    assert deployments_follow_reaudit(report=unstable) == []
    assert list(deployment.report_history.values_list("report_id", flat=True)) == [original.pk]
    event = AuditEvent.objects.get(action="deployment.reaudit_not_applied")
    assert event.data["code"] == "report_unstable" and event.target == f"deployment:{deployment.pk}"
    # The next re-audit supersedes the chain's head (the one that proved nothing) and still moves
    # the deployment off the figure in force (red team 16: it moved nothing, the chain was stuck).
    remeasured = make_report(org, ci_low="1.1", supersedes=unstable)
    (switch,) = deployments_follow_reaudit(report=remeasured)
    assert switch.deployment_id == deployment.pk and switch.report_id == remeasured.pk


def test_it_refuses_to_deploy_an_unstable_report(make_org, make_contract, make_report, make_deployment, billing_settings):
    from metering.errors import BillingError
    from metering.models import Deployment

    org = make_org("acme")
    make_contract(org)
    with pytest.raises(BillingError, match="A/A control was unstable") as refused:
        make_deployment(org, make_report(org, ci_low="2.0", stable=False), name="free")
    assert refused.value.code == "report_unstable" and refused.value.status == 409
    assert not Deployment.objects.filter(name="free").exists()


@pytest.mark.parametrize("ci_low, from_dispute", [("1.1", True), ("1.5", False)])
def test_a_disputed_figure_lowered_by_its_reaudit_applies_from_the_dispute(
        make_org, make_contract, make_report, make_deployment, billing_settings, ci_low, from_dispute):
    from metering.deployments import deployments_follow_reaudit
    from reports.models import Dispute, ReauditRequest

    org = make_org("acme")
    make_contract(org)
    original = make_report(org, ci_low="1.3")
    deployment = make_deployment(org, original, name="prod")
    reaudit = make_report(org, ci_low=ci_low, supersedes=original)
    request = ReauditRequest.objects.create(organization=org, report=original, requested_by="user:owner",
                                            reason="dispute: too high", status="completed", result_report=reaudit)
    dispute = Dispute.objects.create(organization=org, report=original, raised_by="user:owner", reason="too high",
                                     reaudit=request, status="resolved", resolved_at=reaudit.created_at)
    Dispute.objects.filter(pk=dispute.pk).update(created_at=at("2025-01-10 00:00"))
    (switch,) = deployments_follow_reaudit(report=reaudit, actor="system:test")
    # Lower: the customer was right from the day it disputed. Higher: no retroactive charge.
    assert switch.effective_from == (at("2025-01-10 00:00") if from_dispute else reaudit.created_at)
    assert deployment.report_history.count() == 2


@pytest.mark.parametrize("code", ["runner_not_calibrated", "sandbox_incomplete", "device_clock_untrusted"])
def test_a_report_measured_where_figures_cannot_be_trusted_never_bills(make_org, make_contract, make_report,
                                                                       make_deployment, billing_settings, code):
    from metering.deployments import deployments_follow_reaudit
    from metering.errors import BillingError

    org = make_org("acme")
    make_contract(org)
    with pytest.raises(BillingError) as refused:
        make_deployment(org, make_report(org, reasons=(code,)), name="prod")
    assert refused.value.code == "report_untrusted" and code in refused.value.message
    # Nor does a re-audit measured there take over a deployment.
    original = make_report(org)
    deployment = make_deployment(org, original, name="prod")
    assert deployments_follow_reaudit(report=make_report(org, supersedes=original, reasons=(code,))) == []
    assert list(deployment.report_history.values_list("report_id", flat=True)) == [original.pk]


def test_a_billing_run_whose_amount_would_not_fit_its_column_is_refused_whole(make_org, make_contract, make_report,
                                                                             make_deployment, ingest, billing_settings,
                                                                             monkeypatch):
    # Prices and caps are bounded at the contract; what a month's usage adds up to is checked
    # before anything is written (an amount past a column failed the run inside the database).
    # The columns' bound is lowered here so that an ordinary invoice stands in for a huge one.
    from metering import billing
    from metering.errors import BillingError
    from metering.models import BillingRun, Invoice
    from metering.periods import Period

    org = make_org("acme")
    make_contract(org)
    ingest(make_deployment(org, make_report(org, ci_low="1.2"), name="prod"), [("2025-01-10 00:00", "200")])
    real = billing._column
    monkeypatch.setattr(billing, "_column", lambda model, name: (Decimal(10), real(model, name)[1]))  # the fee is 20.00
    with pytest.raises(BillingError) as refused:
        billing.billing_run_create(period=Period(2025, 1), actor="system:test")
    assert refused.value.code == "amount_out_of_range" and refused.value.status == 409
    assert "acme" in refused.value.message or str(org.pk) in refused.value.message
    assert "nothing was stored" in refused.value.message
    assert BillingRun.objects.count() == 0 and Invoice.objects.count() == 0
    monkeypatch.undo()
    run, created = billing.billing_run_create(period=Period(2025, 1), actor="system:test")
    assert created and Invoice.objects.get(run=run).total == Decimal("20.00")


def test_saved_hours_with_the_places_their_product_has_are_billed(make_org, make_contract, make_report,
                                                                    make_deployment, ingest, billing_settings):
    # Hours keep 6 places and a speedup 4, so saved hours routinely carry 10: their column keeps
    # 24. Checked against the hours' column (6 places), one event of 10.000001 h at 1.9x stopped
    # the month's run for every organization (red team 16 against a change in progress).
    from metering import billing
    from metering.models import BillingRecord
    from metering.periods import Period

    org = make_org("acme")
    make_contract(org)
    ingest(make_deployment(org, make_report(org, ci_low="1.9"), name="prod"), [("2025-01-10 00:00", "10.000001")])
    run, created = billing.billing_run_create(period=Period(2025, 1), actor="system:test")
    record = BillingRecord.objects.get(run=run)
    assert created and record.saved_hours == Decimal("10.000001") * (Decimal("1.9") - 1)


@pytest.mark.django_db(transaction=True)
def test_a_report_switch_waits_for_a_billing_run_in_flight_and_lands_after_its_month(
        make_org, make_contract, make_report, make_deployment, ingest, billing_settings, monkeypatch):
    # Red team 14 (2026-12-06): the switch read the billed horizon before the run committed, so it
    # landed inside the month being billed, and a routine reissue later billed that month again at
    # the new report's figure (20.00 -> 60.00). The run is held after planning here, as a run over
    # much usage takes its time there.
    import threading

    from django.db import connection

    from metering import billing
    from metering.deployments import deployment_switch_report
    from metering.periods import Period

    org = make_org("acme")
    make_contract(org)
    original = make_report(org, ci_low="1.2")
    deployment = make_deployment(org, original, name="prod")
    ingest(deployment, [("2025-01-05 00:00", "100"), ("2025-01-25 00:00", "100")])
    reaudit = make_report(org, supersedes=original, ci_low="2.0")
    planned, proceed = threading.Event(), threading.Event()
    fits = billing._fits_columns

    def held(*args, **kwargs):
        fits(*args, **kwargs)
        planned.set()
        assert proceed.wait(20)

    monkeypatch.setattr(billing, "_fits_columns", held)
    switched: list = []

    def run_billing():
        try:
            billing.billing_run_create(period=Period(2025, 1), actor="system:test")
        finally:
            connection.close()

    def switch():
        try:
            switched.append(deployment_switch_report(actor="system:test", deployment=deployment, report=reaudit,
                                                     effective_from=at("2025-01-15 00:00")))
        finally:
            connection.close()

    runner = threading.Thread(target=run_billing)
    runner.start()
    assert planned.wait(20)
    switcher = threading.Thread(target=switch)
    switcher.start()
    switcher.join(0.5)
    assert switcher.is_alive()  # waiting for the run's lock, not reading the horizon before it
    proceed.set()
    runner.join(20)
    switcher.join(20)
    assert not runner.is_alive() and not switcher.is_alive()
    assert switched and switched[0].effective_from == at("2025-02-01 00:00")


def test_an_artifact_deploys_under_its_first_stable_report_whichever_the_customer_names(
        make_org, make_contract, make_report, make_deployment, billing_settings):
    # Red team 16 (2026-12-06): three stable reports of one artifact at lower bounds 1.9, 1.06 and
    # 0.97 were each accepted for a deployment, so the customer billed under the lowest.
    from metering.errors import BillingError

    org = make_org("acme")
    make_contract(org)
    unstable = make_report(org, ci_low="0.80", stable=False)
    artifact, version = unstable.run.artifact_sha256, unstable.run.model_version
    first = make_report(org, ci_low="1.9", artifact_sha256=artifact, version=version)
    lower = make_report(org, ci_low="1.06", artifact_sha256=artifact, version=version)
    nothing = make_report(org, ci_low="0.97", artifact_sha256=artifact, version=version)
    for named in (lower, nothing):
        with pytest.raises(BillingError) as refused:
            make_deployment(org, named, name="prod")
        assert refused.value.code == "report_not_in_force" and refused.value.status == 409
        assert str(first.pk) in refused.value.message
    assert make_deployment(org, first, name="prod").report_history.get().report_id == first.pk
    # The same artifact run again as another model version (an upload of the same model): the same
    # first report. Another artifact, another hardware class: each its own first report.
    with pytest.raises(BillingError) as refused:
        make_deployment(org, make_report(org, ci_low="1.01", artifact_sha256=artifact), name="new-version")
    assert refused.value.code == "report_not_in_force" and str(first.pk) in refused.value.message
    assert make_deployment(org, make_report(org, ci_low="1.06", version=version), name="other-artifact")
    assert make_deployment(org, make_report(org, ci_low="1.06", artifact_sha256=artifact, version=version,
                                            hardware="gpu-h200"), name="on-h200")
    # A re-audit that stands replaces the first; one that proved nothing does not.
    proved_nothing = make_report(org, ci_low="0.5", stable=False, supersedes=first)
    with pytest.raises(BillingError) as refused:
        make_deployment(org, lower, name="again")
    assert str(first.pk) in refused.value.message
    assert make_deployment(org, first, name="still-first")
    remeasured = make_report(org, ci_low="1.4", supersedes=proved_nothing)
    with pytest.raises(BillingError) as refused:
        make_deployment(org, first, name="superseded")
    assert refused.value.code == "report_superseded" and str(remeasured.pk) in refused.value.message
    assert make_deployment(org, remeasured, name="remeasured")



def test_a_contract_that_pins_the_shape_bills_only_reports_measured_at_it(make_org, make_contract, make_report,
                                                                        make_deployment, billing_settings):
    # Red team 18 (2026-12-06): the report in force was the first at whatever shape the customer
    # ran first (batch 8 x seq 512, where GEMMs dominate and the gain is least); the contract's
    # measurement plan now names the shape, and only reports at it count.
    from metering.errors import BillingError

    org = make_org("acme")
    make_contract(org, measurement_plan={**TERMS["measurement_plan"], "batch": 2, "seq": 64})
    low_first = make_report(org, ci_low="1.01", shape=(8, 512))
    artifact, version = low_first.run.artifact_sha256, low_first.run.model_version
    pinned = make_report(org, ci_low="1.5", artifact_sha256=artifact, version=version, shape=(2, 64))
    with pytest.raises(BillingError) as refused:
        make_deployment(org, low_first, name="prod")
    assert refused.value.code == "measurement_plan_mismatch"
    assert "batch 8 x seq 512" in refused.value.message and "batch 2 x seq 64" in refused.value.message
    assert make_deployment(org, pinned, name="prod").report_history.get().report_id == pinned.pk
    # At the pinned shape the first-report rule holds as before.
    later = make_report(org, ci_low="1.1", artifact_sha256=artifact, version=version, shape=(2, 64))
    with pytest.raises(BillingError) as refused:
        make_deployment(org, later, name="prod-2")
    assert refused.value.code == "report_not_in_force" and str(pinned.pk) in refused.value.message


def test_without_a_pinned_shape_the_first_report_at_any_shape_is_in_force(make_org, make_contract, make_report,
                                                                          make_deployment, billing_settings):
    from metering.errors import BillingError

    org = make_org("acme")
    make_contract(org)
    first = make_report(org, ci_low="1.01", shape=(8, 512))
    other_shape = make_report(org, ci_low="1.5", artifact_sha256=first.run.artifact_sha256,
                              version=first.run.model_version, shape=(2, 64))
    with pytest.raises(BillingError) as refused:
        make_deployment(org, other_shape, name="prod")
    assert refused.value.code == "report_not_in_force" and str(first.pk) in refused.value.message


def test_the_report_in_force_follows_what_an_artifact_runs_not_its_documents_hash(make_org, make_contract, make_report,
                                                                                 make_deployment, billing_settings):
    # Red team 18 (2026-12-06): an artifact's document hash covers its timing estimates (a cold
    # search's, or the tuning cache's date), so one optimization got a new hash on every cold run
    # or host, and a customer could deploy under the lowest of their first reports again.
    from metering.errors import BillingError
    from runs.models import Run

    org = make_org("acme")
    make_contract(org)
    code = {"schema": "dyno.optimization-artifact/1", "model": {"config_sha256": "c" * 64}, "device": "cpu",
            "hardware": "gpu-h100", "strategy": "patched-modules", "kernels": {"rmsnorm": "src"},
            "modules": [{"module": "norm", "module_class": "RMSNorm", "status": "optimized", "kernel": "rmsnorm",
                         "shape": {"R": 8}, "reason": "1.31x"}]}

    def report(ci_low, **document):
        made = make_report(org, ci_low=ci_low)
        Run.objects.filter(pk=made.run_id).update(artifact={**code, **document})
        made.run.refresh_from_db()
        return made

    first = report("1.9", estimates={"cold": 1.2}, workload={"batch": 2, "seq": 8})
    warm = report("0.97", estimates={"from_cache": {"decided_at": "2026-12-06"}}, workload={"batch": 2, "seq": 9},
                  modules=[{**code["modules"][0], "shape": {"R": 9}, "reason": "from the cache"}])
    with pytest.raises(BillingError) as refused:
        make_deployment(org, warm, name="prod")
    assert refused.value.code == "report_not_in_force" and str(first.pk) in refused.value.message
    # Other code (another kernel source) is another artifact, with its own first report.
    assert make_deployment(org, report("1.2", kernels={"rmsnorm": "other src"}), name="other-code")


def test_a_lower_reaudit_after_one_that_proved_nothing_applies_from_the_first_dispute(
        make_org, make_contract, make_report, make_deployment, billing_settings):
    # Red team 18: relief counted only the dispute the lower re-audit answered, so a first dispute
    # whose re-audit proved nothing cost the customer the weeks until the second.
    from metering.deployments import deployments_follow_reaudit
    from reports.models import Dispute, ReauditRequest

    org = make_org("acme")
    make_contract(org)
    original = make_report(org, ci_low="1.5")
    deployment = make_deployment(org, original, name="prod")
    unstable = make_report(org, ci_low="0.9", stable=False, supersedes=original)
    lower = make_report(org, ci_low="1.1", supersedes=unstable)
    for when, answered in (("2025-01-03 00:00", unstable), ("2025-01-25 00:00", lower)):
        request = ReauditRequest.objects.create(organization=org, report=original, requested_by="user:owner",
                                                reason="dispute", status="completed", result_report=answered)
        dispute = Dispute.objects.create(organization=org, report=original, raised_by="user:owner", reason="high",
                                         reaudit=request, status="resolved", resolved_at=answered.created_at)
        Dispute.objects.filter(pk=dispute.pk).update(created_at=at(when))
    (switch,) = deployments_follow_reaudit(report=lower)
    assert switch.deployment_id == deployment.pk and switch.effective_from == at("2025-01-03 00:00")
