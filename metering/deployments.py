"""Deployments: an optimized model version serving on a hardware class, and the history of which
signed report it bills under from when (a re-audit's report applies from its date)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Organization
from accounts.selectors import Actor
from api.bounded import InputRejected, instant_bounded
from auditlog.services import actor_label, audit_record
from metering.billing import billing_lock
from metering.contracts import billed_horizon
from metering.errors import BillingError
from metering.models import Contract, Deployment, DeploymentReport
from metering.periods import Period
from metering.selectors import contract_in_force
from reports.document import UNTRUSTED
from reports.models import Dispute, Report


def report_suite(report: Report) -> dict[str, Any]:
    """The suite a report was measured on, read from the signed body (the source of truth)."""
    try:
        body = json.loads(bytes(report.body))
    except (ValueError, TypeError):
        body = None
    suite = body.get("suite") if isinstance(body, dict) else None
    return suite if isinstance(suite, dict) else {}


def report_untrusted(report: Report) -> list[str]:
    """Codes in the signed body that say the measurement itself cannot be trusted (an incomplete
    sandbox, a runner that failed its calibration): such a report never bills."""
    try:
        body = json.loads(bytes(report.body))
    except (ValueError, TypeError):
        return []
    billing = body.get("billing") if isinstance(body, dict) else None
    reasons = billing.get("reasons") if isinstance(billing, dict) else None
    return sorted({r.get("code") for r in reasons or [] if isinstance(r, dict) and r.get("code") in UNTRUSTED})


def figure_stands(report: Report) -> bool:
    """Whether a report's figure can stand for the artifact it measured at all: a stable A/A
    control, a trusted measurement and a model-level interval (the contract's own checks aside)."""
    return bool(report.stable) and report.model_ci_low is not None and not report_untrusted(report)


def replaced_by(report: Report) -> Report | None:
    """The re-audit report that replaces `report` for billing: the first one down its re-audit
    chain (each report is superseded once) whose figure stands. A re-audit that proved nothing
    (its A/A unstable, its runner untrusted) replaces nothing: the figure in force keeps billing,
    a dispute may ask again, and the next re-audit supersedes the chain's head."""
    current, seen = report, {report.pk}
    while (current := Report.objects.filter(supersedes=current).first()) is not None and current.pk not in seen:
        if figure_stands(current):
            return current
        seen.add(current.pk)
    return None


def ancestors(report: Report) -> list[Report]:
    """Every report up `report`'s re-audit chain, newest first. A deployment may still bill under
    any of them: a re-audit that proved nothing, or that stood but could not bill under the
    contract (another suite after a runner upgrade), moved nothing, and a deployment left on an
    older report must follow the next re-audit that can bill (red team 18, 2026-12-06: a
    deployment stranded on its first report for good)."""
    found: list[Report] = []
    current = report
    while current.supersedes_id is not None and len(found) < 1000:
        current = Report.objects.get(pk=current.supersedes_id)
        found.append(current)
    return found


# What in an artifact document says how it was decided, not what runs: timings, verification
# records, notes and the shape it was tuned at (a module's shape and reason likewise).
_NOT_CODE = ("workload", "verification", "estimates", "notes")


def artifact_identity(run: Any) -> str:
    """A hash of what an artifact runs: its document less what says how it was decided. The
    document's own hash covers its timing estimates (a cold search's, or the tuning cache's date
    on a warm hit), so one optimization of one model got a new hash on every cold run, host and
    cache state (red team 18, 2026-12-06), and the report in force could be shopped for again.
    A run without an artifact document: its artifact hash (empty without one)."""
    artifact = getattr(run, "artifact", None)
    if not isinstance(artifact, dict):
        return getattr(run, "artifact_sha256", "") or ""
    kept = {key: value for key, value in artifact.items() if key not in _NOT_CODE}
    kept["modules"] = [{key: value for key, value in module.items() if key not in ("shape", "reason")}
                       for module in artifact.get("modules") or [] if isinstance(module, dict)]
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def report_in_force(report: Report, contract: Contract | None = None) -> Report:
    """The report that bills the artifact `report` measured, on its hardware class: the first
    report of the organization for that artifact and hardware whose figure stands, followed
    through the re-audits that replaced it. Several runs of one artifact (a cached or
    deterministic optimization) give several figures; a customer who could deploy under any of
    them would pick the lowest, and bill nothing under one whose interval reaches below 1 (red
    team 16, 2026-12-06: three stable reports of one artifact at lower bounds 1.9, 1.06 and 0.97
    were each accepted for a deployment). Any model version counts: the same model uploaded
    again as a new version runs the same artifact (the optimizer's cache), and per version the
    shopping would start over. Only a re-audit, which disputes and the re-audit limits govern,
    moves the figure. A report without an artifact stands for itself.

    Where the contract's measurement plan pins a shape (batch x sequence), only reports measured
    at it count: the first report at another shape, which the customer chose by running it first,
    neither bills nor stands in the way (red team 18, 2026-12-06: the first report's shape was
    whatever the customer ran first, the one where the gain is least)."""
    identity = artifact_identity(report.run) if report.run_id is not None else ""
    if not identity:
        return report
    peers = (Report.objects.filter(organization_id=report.organization_id, hardware=report.hardware)
             .select_related("run").order_by("created_at", "pk"))
    if contract is not None and contract.measured_batch is not None:
        peers = peers.filter(run__batch=contract.measured_batch, run__seq=contract.measured_seq)
    current = next((peer for peer in peers if peer.run_id is not None and artifact_identity(peer.run) == identity
                    and figure_stands(peer)), None)
    if current is None:
        return report
    seen = {current.pk}
    while (successor := replaced_by(current)) is not None and successor.pk not in seen:
        seen.add(successor.pk)
        current = successor
    return current


def _check_billable_report(*, report: Report, contract: Contract, hardware: str, artifact_sha256: str | None = None) -> None:
    """A report bills under a contract only if it measured the deployed artifact, was stable, was
    measured where the measurement can be trusted, and as the contract's plan says. Which report
    bills is a rule: nobody picks a convenient one."""
    if artifact_sha256 is not None and (report.run.artifact_sha256 or "") != artifact_sha256:
        raise BillingError("report_artifact_mismatch",
                           f"report {report.pk} measured artifact {report.run.artifact_sha256 or 'none'}, not the "
                           f"deployed {artifact_sha256 or 'none'}; a deployment bills only under reports of the "
                           "artifact it runs (deploy the other artifact as its own deployment).", status=409)
    if not report.stable:
        raise BillingError("report_unstable",
                           f"report {report.pk}'s A/A control was unstable, so its figure proves no speedup and "
                           "cannot bill; deploy under a stable report of this artifact (ask for a re-audit, or "
                           "re-run on a quieter runner).", status=409)
    untrusted = report_untrusted(report)
    if untrusted:
        raise BillingError("report_untrusted",
                           f"report {report.pk} was measured where its figures cannot bill ({', '.join(untrusted)}: "
                           "see the report's billing reasons); measure the artifact again on a runner with a "
                           "complete sandbox and a passing calibration.", status=409)
    if report.model_ci_low is None:
        raise BillingError("report_not_billable", f"report {report.pk} holds no model-level confidence interval; "
                                                  "deploy with a report of a run that measured the whole model.")
    successor = replaced_by(report)
    if successor is not None:
        raise BillingError("report_superseded", f"report {report.pk} was replaced by re-audit report {successor.pk}; "
                                                "use the newest report of the chain.", status=409)
    if contract.measured_batch is not None and (report.run.batch, report.run.seq) != (contract.measured_batch,
                                                                                        contract.measured_seq):
        raise BillingError("measurement_plan_mismatch",
                           f"report {report.pk} measured the model at batch {report.run.batch} x seq {report.run.seq}, "
                           f"but the contract's measurement plan pins batch {contract.measured_batch} x seq "
                           f"{contract.measured_seq}; run the model at the pinned shape and deploy under that "
                           "report.")
    if hardware not in contract.prices:
        raise BillingError("hardware_not_priced", f"contract version {contract.version} has no price for "
                                                  f"{hardware}; ask finance to add it in a new version.")
    suite = report_suite(report)
    if suite.get("version") != contract.suite_version:
        raise BillingError("measurement_plan_mismatch",
                           f"report {report.pk} was measured on suite {suite.get('version')!r} but the contract's "
                           f"measurement plan pins suite {contract.suite_version!r}; re-run on the pinned suite.")
    if contract.suite_manifest_sha256 and suite.get("manifest_sha256") != contract.suite_manifest_sha256:
        raise BillingError("measurement_plan_mismatch",
                           f"report {report.pk} was measured on suite manifest {suite.get('manifest_sha256')!r}, not "
                           f"the pinned {contract.suite_manifest_sha256}.")


def _contract_at(organization_id: int, moment: datetime) -> Contract:
    contract = contract_in_force(organization_id=organization_id, day=moment.date())
    if contract is None:
        raise BillingError("no_contract", f"no contract is in force on {moment.date()}; finance adds one before "
                                          "usage can be billed.")
    return contract


def _instant(moment: datetime, what: str) -> datetime:
    """`moment` in UTC, refused (400) outside the window every stored instant lies in (api/bounded.py):
    past it, converting, adding a month or reading the row back again would fail."""
    try:
        return instant_bounded(moment, what=what)
    except InputRejected as exc:
        raise BillingError("invalid_field", exc.message) from None


def _not_before_horizon(moment: datetime) -> datetime:
    horizon = billed_horizon()
    if horizon is None:
        return moment
    start = Period.of(horizon).start
    return max(moment, start)


def deployment_create(*, actor: Actor, organization: Organization, report: Report, name: str,
                      active_from: datetime | None = None) -> Deployment:
    """Deploy the artifact a signed report measured; usage bills under that report from `active_from`."""
    if not actor.can_write(organization.pk):
        raise BillingError("forbidden", "only the organization's owners, members and customer keys deploy.",
                           status=403)
    if report.organization_id != organization.pk or report.run_id is None:
        raise BillingError("not_found", "No such report in your organization.", status=404)
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise BillingError("invalid_field", "a deployment needs a name of 1 to 100 characters (e.g. \"prod-eu\").")
    moment = _instant(active_from or timezone.now(), "active_from")
    run = report.run
    try:
        with transaction.atomic():
            billing_lock()  # the horizon as no billing run is about to move it (deployment_switch_report)
            if _not_before_horizon(moment) != moment:
                raise BillingError("billed_period", f"{moment:%Y-%m} is already billed; a deployment starts later.",
                                   status=409)
            contract = _contract_at(organization.pk, moment)
            _check_billable_report(report=report, contract=contract, hardware=report.hardware)
            in_force = report_in_force(report, contract)
            if in_force.pk != report.pk:
                raise BillingError(
                    "report_not_in_force",
                    f"report {report.pk} is not the report that bills artifact {run.artifact_sha256[:12]} on "
                    f"{report.hardware}: report {in_force.pk} of {in_force.created_at:%Y-%m-%d} is (the first stable, "
                    "trusted measurement of that artifact, followed through its re-audits; neither party picks among "
                    f"several runs of one artifact). Deploy under report {in_force.pk}, or dispute it to have it "
                    "measured again.", status=409)
            deployment = Deployment.objects.create(
                organization=organization, name=name, model_version_id=run.model_version_id,
                hardware=report.hardware, artifact_sha256=run.artifact_sha256 or "", active_from=moment,
                created_by=actor_label(actor))
            DeploymentReport.objects.create(deployment=deployment, report=report, effective_from=moment,
                                            created_by=actor_label(actor))
            audit_record(action="deployment.created", actor=actor, organization_id=organization.pk,
                         target=f"deployment:{deployment.pk}",
                         data={"name": name, "report": str(report.pk), "report_sha256": report.body_sha256,
                               "hardware": report.hardware, "active_from": moment.isoformat()})
    except IntegrityError:
        raise BillingError("name_taken", f"a deployment named {name!r} exists; pick another name.",
                           status=409) from None
    return deployment


def deployment_switch_report(*, actor: Any, deployment: Deployment, report: Report,
                             effective_from: datetime | None = None, reason: str = "") -> DeploymentReport:
    """Bill under `report` from its date (a re-audit), or from `effective_from`. A billed month is
    never re-priced: a date inside one moves to the first unbilled moment.

    Called by the system when a re-audit's report is stored (`deployments_follow_reaudit`), and by
    the billing operator's finance to correct a deployment by hand, with a reason for the audit log;
    the customer never chooses."""
    if report.organization_id != deployment.organization_id or report.run_id is None:
        raise BillingError("not_found", "No such report in your organization.", status=404)
    if report.run.model_version_id != deployment.model_version_id or report.hardware != deployment.hardware:
        raise BillingError("report_mismatch", f"report {report.pk} measured another model version or hardware "
                                              f"class than deployment {deployment.name} serves.")
    asked = _instant(effective_from or report.created_at, "effective_from")
    with transaction.atomic():
        # The billed horizon is read under the billing runs' lock: read before it, a switch that
        # committed while a run billed its month landed inside that month, and a later reissue
        # re-priced it (red team 14, 2026-12-06: a routine reissue moved 20.00 to 60.00).
        billing_lock()
        moment = _not_before_horizon(asked)
        # Lock the deployment so two switches cannot interleave their "latest" checks.
        Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
        current = deployment.report_history.order_by("-effective_from").first()
        if current is not None and current.report_id == report.pk:
            return current
        if current is not None and moment <= current.effective_from:
            raise BillingError("report_order", f"report {current.report_id} applies from "
                                               f"{current.effective_from.isoformat()}; a new report applies later.",
                               status=409)
        _check_billable_report(report=report, contract=_contract_at(deployment.organization_id, moment),
                               hardware=deployment.hardware, artifact_sha256=deployment.artifact_sha256 or "")
        try:
            switch = DeploymentReport.objects.create(deployment=deployment, report=report, effective_from=moment,
                                                     created_by=actor_label(actor))
        except IntegrityError:
            raise BillingError("report_order", f"report {report.pk} already applied to this deployment.",
                               status=409) from None
        audit_record(action="deployment.report_switched", actor=actor, organization_id=deployment.organization_id,
                     target=f"deployment:{deployment.pk}",
                     data={"report": str(report.pk), "report_sha256": report.body_sha256,
                           "effective_from": moment.isoformat(), "reason": reason[:500],
                           "previous_report": str(current.report_id) if current else None})
    return switch


def deployments_follow_reaudit(*, report: Report, actor: Any = "system:reaudit") -> list[DeploymentReport]:
    """Move every deployment currently billed under the report `report` supersedes onto `report`,
    from its date. The reports app calls this in the transaction that stores a re-audit's report,
    so the figure that bills follows the newest measurement with no one choosing.

    A re-audit that cannot bill (unstable, off the contract's plan, another artifact) moves nothing:
    the deployment stays on the figure in force, and the audit log says why.

    A re-audit that answers a dispute and lowers the figure applies from the dispute's date
    (usage during the dispute is billed at the lower figure; months already billed are not
    re-priced); one that raises it applies from its own date only."""
    if report.supersedes_id is None:
        return []
    # A deployment may bill under any report up the chain: a re-audit that proved nothing, or one
    # that could not bill under the contract, moved nothing (red teams 16 and 18, 2026-12-06).
    chain = ancestors(report)
    replaced = {r.pk for r in chain}
    relief_from = _dispute_relief_from(report, chain)
    switched = []
    for deployment in Deployment.objects.filter(report_history__report_id__in=replaced).distinct():
        current = deployment.report_history.order_by("-effective_from").first()
        if current is None or current.report_id not in replaced:
            continue
        since, why = None, "re-audit report supersedes the report in force"
        if relief_from is not None and relief_from > current.effective_from:
            since, why = relief_from, "re-audit answering a dispute lowered the figure: applies from the dispute"
        try:
            switched.append(deployment_switch_report(actor=actor, deployment=deployment, report=report,
                                                     effective_from=since, reason=why))
        except BillingError as exc:
            audit_record(action="deployment.reaudit_not_applied", actor=actor, organization_id=deployment.organization_id,
                         target=f"deployment:{deployment.pk}",
                         data={"report": str(report.pk), "code": exc.code, "message": exc.message[:500]})
    return switched


def _dispute_relief_from(report: Report, chain: list[Report]) -> datetime | None:
    """When the re-audit `report` lowers the CI bound of the figure in force (the newest report of
    `chain`, its ancestors newest first, whose figure stands) and answers a dispute: the date of
    the first dispute since that figure came in force that no standing re-audit answered (one
    whose re-audit proved nothing still counts: the customer was right from then). Otherwise None
    (the new figure applies from its own date). Only disputes that this re-audit's report
    answered counted before, so an inconclusive first re-audit cost the customer its weeks (red
    team 18, 2026-12-06)."""
    standing = next((r for r in chain if figure_stands(r)), None)
    old = standing or (chain[0] if chain else None)
    if old is None or report.model_ci_low is None or old.model_ci_low is None or report.model_ci_low >= old.model_ci_low:
        return None
    # The re-audits between the figure in force and this one: none of them stood.
    between = [r.pk for r in chain[:chain.index(old)]] if standing is not None else [r.pk for r in chain]
    disputes = Dispute.objects.filter(report_id__in=[r.pk for r in chain])
    answered = disputes.filter(reaudit__result_report=report) | disputes.filter(reaudit__result_report_id__in=between)
    return answered.order_by("created_at").values_list("created_at", flat=True).first()


def deployment_data(deployment: Deployment) -> dict[str, Any]:
    history = list(deployment.report_history.select_related("report").order_by("effective_from"))
    return {
        "id": str(deployment.pk), "name": deployment.name, "organization": deployment.organization.slug,
        "model_version": str(deployment.model_version_id), "hardware": deployment.hardware,
        "artifact_sha256": deployment.artifact_sha256 or None, "active_from": deployment.active_from.isoformat(),
        "reports": [{"report": str(h.report_id), "report_sha256": h.report.body_sha256,
                     "ci_low": str(h.report.model_ci_low), "stable": h.report.stable,
                     "effective_from": h.effective_from.isoformat()} for h in history],
    }
