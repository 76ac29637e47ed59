"""Writes for reports: create and sign a run's report, request and execute re-audits, open disputes.

Every write here is audited (auditlog) and guarded by a database constraint: one report per
run, one open re-audit per report, a report superseded at most once. A re-audit is started as it
is requested (on commit) and by a periodic sweep, both through `reaudit_dispatch`, whose claim is
a conditional update under a row lock: two dispatchers never start two runs for one request.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Organization, Role, Scope
from accounts.selectors import Actor
from auditlog.services import audit_record
from dyno.dispatch import reaudit_enqueue, report_enqueue
from metering.deployments import deployments_follow_reaudit, figure_stands
from metering.selectors import contract_in_force
from reports.document import (
    ModelFacts,
    ModelFile,
    ReportError,
    RunFacts,
    Supersession,
    model_figure,
    report_body,
)
from reports.models import (
    OPEN_REAUDIT,
    Dispute,
    DisputeStatus,
    ReauditRequest,
    ReauditStatus,
    Report,
    ReportKind,
)
from reports.signing import report_sign
from proof.canonical import CanonicalError, canonical_bytes
from runs.models import Run
from runs.status import Status

log = logging.getLogger(__name__)

DEFAULT_DISPUTE_DAYS = 30
MAX_REASON_CHARS = 4000
# Who may contest a report: the customer's people and keys, not its auditors (they re-audit).
DISPUTING_ROLES = frozenset({Role.OWNER, Role.MEMBER, Role.FINANCE, Scope.CUSTOMER})


class ReportRefused(ValueError):
    """A dispute or re-audit request that cannot be honoured; the message says why and what to do.

    `code`: "forbidden" (the actor's role may not), "window_closed" (too late to dispute),
    "limit_reached" (the report's chain was already re-measured on dispute, or the organization's
    re-measurements for this window are used up) or "invalid_reason" (empty or too long).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def report_create_for_run(*, run: Run) -> Report:
    """The signed report of a succeeded run; the existing one if it was already made.

    A run the pipeline executed for a re-audit request (`reaudit_claim`) gets a `reaudit` report
    that supersedes the latest report of the re-audited chain; a `python -m runners audit`
    result (it carries a top-level verdict) gets an `audit` report; any other run a `run` report.
    """
    existing = Report.objects.filter(run_id=run.pk).first()
    if existing is not None:
        return existing
    with transaction.atomic():
        # The row lock serializes two creators of the same run's report (a task delivered twice).
        run = (Run.objects.select_for_update(of=("self",))
               .select_related("organization", "model_version", "model_version__model").get(pk=run.pk))
        existing = Report.objects.filter(run_id=run.pk).first()
        if existing is not None:
            return existing
        if run.status != Status.SUCCEEDED:
            raise ReportError(f"run {run.pk} is {run.status}; only a succeeded run gets a report.")
        reaudit = ReauditRequest.objects.select_for_update().filter(run=run).first()
        supersedes = report_chain_head(reaudit.report) if reaudit else None
        kind = (ReportKind.REAUDIT if reaudit else
                ReportKind.AUDIT if isinstance(run.result, dict) and "verdict" in run.result else ReportKind.RUN)
        body = report_body_bytes(run=run, kind=kind, reaudit=reaudit, supersedes=supersedes)
        signature = report_sign(body=body)
        figure = model_figure(run.result)
        report = Report.objects.create(
            organization_id=run.organization_id, kind=kind, run=run, supersedes=supersedes,
            hardware=run.hardware, body=body, body_sha256=hashlib.sha256(body).hexdigest(),
            key_id=signature["key_id"], signature=signature["signature"],
            model_speedup=figure.speedup, model_ci_low=figure.ci_low, model_ci_high=figure.ci_high,
            stable=figure.stable,
        )
        audit_record(action="report.created", organization_id=run.organization_id, target=f"report:{report.pk}",
                     data={"run": str(run.pk), "kind": kind, "body_sha256": report.body_sha256,
                           "key_id": report.key_id, "model_ci_low": figure.ci_low, "stable": figure.stable,
                           "billable": figure.billable.billable,
                           "supersedes": str(supersedes.pk) if supersedes else None})
        if reaudit is not None:
            _reaudit_complete(reaudit, report)
        if supersedes is not None:
            # Deployments billed under the superseded figure move to this one, from now, in this
            # transaction: the newest measurement bills, and nobody picks which.
            deployments_follow_reaudit(report=report)
    log.info("report %s signed for run %s (%s, key %s)", report.pk, run.pk, kind, report.key_id)
    return report


def report_body_bytes(*, run: Run, kind: str, reaudit: ReauditRequest | None = None,
                      supersedes: Report | None = None) -> bytes:
    """The canonical bytes a run's report signs; a function of stored facts only (same run, same bytes)."""
    version = run.model_version
    model = None if version is None else ModelFacts(
        organization=run.organization.slug, name=version.model.name, version=version.number,
        version_id=str(version.pk), kind=version.kind, family=version.family,
        architecture=version.architecture, parameter_count=version.parameter_count, dtype=version.dtype,
        files=tuple(ModelFile(path=f.path, size=f.size, sha256=f.sha256) for f in version.files.order_by("path")),
    )
    facts = RunFacts(run_id=str(run.pk), hardware=run.hardware, profile=run.profile, batch=run.batch,
                     seq=run.seq, finished_at=run.finished_at.isoformat() if run.finished_at else "",
                     artifact_sha256=run.artifact_sha256)
    superseded = None
    if reaudit is not None and supersedes is not None:
        superseded = Supersession(report_id=str(supersedes.pk), report_sha256=supersedes.body_sha256,
                                  reaudit_request_id=str(reaudit.pk), requested_by=reaudit.requested_by,
                                  reason=reaudit.reason)
    try:
        return canonical_bytes(report_body(kind=str(kind), result=run.result, model=model, run=facts,
                                           supersedes=superseded, organization=run.organization.slug))
    except CanonicalError as exc:
        raise ReportError(f"run {run.pk}'s result cannot be written as canonical JSON ({exc}); "
                          "the runner stored a value JSON cannot carry.") from None


def report_chain_head(report: Report) -> Report:
    """The newest report in `report`'s re-audit chain (itself when nothing supersedes it)."""
    head = report
    while True:
        newer = Report.objects.filter(supersedes=head).first()
        if newer is None:
            return head
        head = newer


# --- re-audits ----------------------------------------------------------------------------------


def reaudit_request(*, actor: Actor, report: Report, reason: str) -> ReauditRequest:
    """An auditor (or staff) asks for `report` to be measured again; the run pipeline picks it up."""
    role = actor.role_in(report.organization_id)
    if not (actor.is_staff or role in (Role.AUDITOR, Scope.AUDITOR)):
        raise ReportRefused("forbidden", "only auditors assigned to this organization (and staff) request re-audits; "
                            f"customers dispute a report within {dispute_window_days(report)} days instead.")
    return _reaudit_open(actor=actor, report=report, reason=_reason(reason, "re-audit"), what="re-audit")


def reaudit_claim(*, request_id, run: Run) -> bool:
    """The pipeline started `run` for this request. False if another worker claimed it first."""
    with transaction.atomic():
        claimed = ReauditRequest.objects.filter(pk=request_id, status=ReauditStatus.REQUESTED).update(
            status=ReauditStatus.RUNNING, run=run, updated_at=timezone.now())
        if claimed:
            request = ReauditRequest.objects.get(pk=request_id)
            audit_record(action="reaudit.started", organization_id=request.organization_id,
                         target=f"reaudit:{request_id}", data={"run": str(run.pk)})
    return claimed == 1


def reaudit_fail(*, request_id, error: str) -> bool:
    """The re-audit could not run; the request stays on record with the error, disputes stay open."""
    with transaction.atomic():
        failed = ReauditRequest.objects.filter(pk=request_id, status__in=OPEN_REAUDIT).update(
            status=ReauditStatus.FAILED, error=error[:MAX_REASON_CHARS], updated_at=timezone.now())
        if failed:
            request = ReauditRequest.objects.get(pk=request_id)
            audit_record(action="reaudit.failed", organization_id=request.organization_id,
                         target=f"reaudit:{request_id}", data={"error": error[:500]})
    return failed == 1


def reaudit_dispatch(*, request_id) -> Run | None:
    """Start the run a requested re-audit needs; None if there is nothing (more) to start.

    The new run repeats the re-audited report's run (same candidate or model version, hardware,
    profile, batch and seq) on today's runners; its report supersedes the chain's newest report
    and completes the request (`report_create_for_run`), its failure fails it (`reaudit_run_ended`).
    """
    from runs.services import RunRejected, run_repeat

    with transaction.atomic():
        # skip_locked: a second dispatcher of the same request moves on instead of waiting to lose.
        request = (ReauditRequest.objects.select_for_update(skip_locked=True, of=("self",))
                   .select_related("report__run").filter(pk=request_id, status=ReauditStatus.REQUESTED).first())
        if request is None:
            return None
        original = request.report.run
        if original is None:
            reaudit_fail(request_id=request.pk, error="the report names no run, so there is nothing to measure "
                                                      "again; ask for a re-audit of a report made by a run.")
            return None
        try:
            run = run_repeat(run=original, requested_by=request.requested_by,
                             why=f"re-audit {request.pk} of report {request.report_id}")
        except RunRejected as exc:
            reaudit_fail(request_id=request.pk, error=str(exc))
            return None
        if not reaudit_claim(request_id=request.pk, run=run):  # cannot happen under the lock; never two runs
            transaction.set_rollback(True)
            return None
    log.info("re-audit %s of report %s started as run %s", request.pk, request.report_id, run.pk)
    return run


def reaudit_run_ended(*, run_id, error: str) -> bool:
    """The run a re-audit started failed or was cancelled: the request fails with why."""
    request = ReauditRequest.objects.filter(run_id=run_id, status=ReauditStatus.RUNNING).only("pk").first()
    return request is not None and reaudit_fail(request_id=request.pk, error=error)


def reports_sweep(*, now: datetime | None = None, report_grace_seconds: int = 60) -> dict[str, list[str]]:
    """Catch up on whatever a lost message or a crash left undone; safe to run any time, twice.

    Starts requested re-audits, fails running ones whose run ended without a result, and asks
    again for the report of every recently succeeded run that still has none (the report task
    returns the existing report if one appears meanwhile).
    """
    from reports.selectors import reaudit_requests_pending, reaudit_requests_run_ended, runs_missing_report

    now = now or timezone.now()
    done: dict[str, list[str]] = {"started": [], "failed": [], "reports": []}
    for request_id in list(reaudit_requests_pending().values_list("pk", flat=True)[:100]):
        run = reaudit_dispatch(request_id=request_id)
        if run is not None:
            done["started"].append(str(request_id))
    for request in reaudit_requests_run_ended():
        run = request.run
        error = f"the re-audit run {run.pk} {run.status}: {run.error or 'no result'}"
        if reaudit_fail(request_id=request.pk, error=error):
            done["failed"].append(str(request.pk))
    for run_id in runs_missing_report(before=now - timedelta(seconds=report_grace_seconds)):
        report_enqueue(run_id)
        done["reports"].append(str(run_id))
    if any(done.values()):
        log.warning("reports sweep caught up: %s", {k: len(v) for k, v in done.items()})
    return done


def _reaudit_open(*, actor: Actor, report: Report, reason: str, what: str) -> ReauditRequest:
    """The open re-audit of `report`: the one already open (a second asker joins it, nothing more
    is measured), or a new one inside the organization's limit (the operator's are not counted)."""
    open_request = ReauditRequest.objects.filter(report=report, status__in=OPEN_REAUDIT).first()
    if open_request is not None:
        return open_request
    try:
        with transaction.atomic():
            # The organization's row lock serializes two askers, so the limit is never overrun by a race.
            Organization.objects.select_for_update().filter(pk=report.organization_id).first()
            open_request = ReauditRequest.objects.filter(report=report, status__in=OPEN_REAUDIT).first()
            if open_request is not None:
                return open_request
            if not actor.is_staff:
                _within_window_limit(report=report, what=what)
            request = ReauditRequest.objects.create(organization_id=report.organization_id, report=report,
                                                    requested_by=actor.audit_label, reason=reason,
                                                    by_operator=actor.is_staff)
            audit_record(action="reaudit.requested", actor=actor, organization_id=report.organization_id,
                         target=f"report:{report.pk}", data={"reaudit": str(request.pk), "reason": reason,
                                                             "by_operator": actor.is_staff})
            reaudit_enqueue(request.pk)
    except IntegrityError:
        # Someone opened one between our read and our insert: the constraint kept it single.
        return ReauditRequest.objects.get(report=report, status__in=OPEN_REAUDIT)
    return request


def reaudit_window_days(organization_id: int, day=None) -> int:
    """The organization's re-measurement window: its contract's dispute window in force on `day`
    (today by default), or `DYNO_REPORT_DISPUTE_DAYS` where no contract is in force."""
    contract = contract_in_force(organization_id=organization_id, day=day or timezone.localdate())
    if contract is not None:
        return int(contract.dispute_window_days)
    return int(getattr(settings, "DYNO_REPORT_DISPUTE_DAYS", DEFAULT_DISPUTE_DAYS))


def reaudits_counted(*, organization_id: int, now: datetime | None = None) -> tuple[int, int, datetime]:
    """(re-measurements counted against the limit, the limit, the start of the window).

    Counted: requests not asked by the operator, inside the window, that measured or will
    measure (a failed one measured nothing and gives its place back)."""
    now = now or timezone.now()
    since = now - timedelta(days=max(1, reaudit_window_days(organization_id, timezone.localdate(now))))
    used = _counted(organization_id, since).count()
    return used, int(getattr(settings, "DYNO_REAUDITS_PER_WINDOW", 2)), since


def _counted(organization_id: int, since: datetime):
    """Re-audits that count against the limit: not the operator's, since `since`, measured or measuring."""
    return ReauditRequest.objects.filter(organization_id=organization_id, by_operator=False, created_at__gte=since,
                                         status__in=(*OPEN_REAUDIT, ReauditStatus.COMPLETED))


def _within_window_limit(*, report: Report, what: str) -> None:
    used, limit, since = reaudits_counted(organization_id=report.organization_id)
    if used >= limit:
        oldest = (_counted(report.organization_id, since).order_by("created_at")
                  .values_list("created_at", flat=True).first())
        days = reaudit_window_days(report.organization_id)
        again = f"; the next is possible after {oldest + timedelta(days=days):%Y-%m-%d %H:%M} UTC" if oldest else ""
        raise ReportRefused("limit_reached",
                            f"this organization's reports were re-measured {used} times in the last {days} days, "
                            f"the limit of its contract window ({limit}){again}. A {what} beyond it is started "
                            "by Dyno's operator: write to them with the report id and the reason.")


def _reaudit_complete(request: ReauditRequest, report: Report) -> None:
    now = timezone.now()
    ReauditRequest.objects.filter(pk=request.pk).update(status=ReauditStatus.COMPLETED, result_report=report,
                                                        updated_at=now)
    resolved = Dispute.objects.filter(reaudit=request, status=DisputeStatus.OPEN).update(
        status=DisputeStatus.RESOLVED, resolved_at=now)
    audit_record(action="reaudit.completed", organization_id=request.organization_id,
                 target=f"reaudit:{request.pk}",
                 data={"report": str(report.pk), "supersedes": str(report.supersedes_id),
                       "disputes_resolved": resolved})


# --- disputes -----------------------------------------------------------------------------------


def dispute_window_days(report: Report) -> int:
    """Days after a report's creation during which its customer may dispute it: the window of the
    organization's contract in force on the day the report was made, or `DYNO_REPORT_DISPUTE_DAYS`
    where no contract was in force."""
    return reaudit_window_days(report.organization_id, timezone.localdate(report.created_at))


def dispute_deadline(report: Report) -> datetime:
    return report.created_at + timedelta(days=dispute_window_days(report))


def report_dispute(*, actor: Actor, report: Report, reason: str) -> Dispute:
    """The customer contests `report`; the dispute asks for (or joins) a re-audit of it."""
    if actor.role_in(report.organization_id) not in DISPUTING_ROLES:
        raise ReportRefused("forbidden", "only the organization's owners, members, finance people and customer keys "
                            "dispute its reports; auditors request a re-audit instead.")
    text = _reason(reason, "dispute")
    deadline = dispute_deadline(report)
    if timezone.now() > deadline:
        raise ReportRefused("window_closed", f"the {dispute_window_days(report)}-day dispute window of this report "
                                             f"closed on {deadline:%Y-%m-%d}; ask an auditor assigned to your "
                                             "organization for a re-audit.")
    with transaction.atomic():
        measured = _chain_disputed_and_measured(report)
        if measured is not None and not (ReauditRequest.objects.filter(report=report, status__in=OPEN_REAUDIT)
                                         .exists()):
            raise ReportRefused("limit_reached",
                                f"this report's measurement was already disputed and re-measured (dispute "
                                f"{measured.pk} of {measured.created_at:%Y-%m-%d}, re-audit report "
                                f"{measured.reaudit.result_report_id}); a dispute re-measures once. A second "
                                "re-measurement is started by Dyno's operator: write to them with the report id.")
        _joining_limits(actor=actor, report=report)
        request = _reaudit_open(actor=actor, report=report, reason=f"dispute: {text}", what="dispute")
        dispute = Dispute.objects.create(organization_id=report.organization_id, report=report,
                                         raised_by=actor.audit_label, reason=text, reaudit=request)
        audit_record(action="report.disputed", actor=actor, organization_id=report.organization_id,
                     target=f"report:{report.pk}",
                     data={"dispute": str(dispute.pk), "reaudit": str(request.pk), "reason": text})
    return dispute


def _joining_limits(*, actor: Actor, report: Report) -> None:
    """Disputes that join an open re-audit measure nothing more, but each is a row and a notice:
    one open dispute per person (or key) per report, and at most DYNO_DISPUTES_PER_REPORT open in all."""
    open_disputes = Dispute.objects.select_for_update().filter(report=report, status=DisputeStatus.OPEN)
    mine = open_disputes.filter(raised_by=actor.audit_label).first()
    if mine is not None:
        raise ReportRefused("limit_reached", f"you already disputed this report (dispute {mine.pk}, open since "
                                             f"{mine.created_at:%Y-%m-%d}); its re-audit is under way.")
    limit = settings.DYNO_DISPUTES_PER_REPORT
    if open_disputes.count() >= limit:
        raise ReportRefused("limit_reached", f"this report already has {limit} open disputes, joined to one "
                                             "re-audit; it answers all of them.")


def _chain_disputed_and_measured(report: Report) -> Dispute | None:
    """A dispute anywhere in `report`'s re-audit chain whose re-audit measured: completed with a
    report whose figure stands (metering.deployments.figure_stands). A re-audit whose A/A control
    was unstable proved nothing and replaced nothing; counted as the chain's one re-measurement,
    it spent the customer's dispute and left the contested figure billing for good (red team 16,
    2026-12-06, on a box where many A/A controls are unstable)."""
    chain, older = {report.pk}, report
    while older.supersedes_id is not None:
        older = Report.objects.only("pk", "supersedes_id").get(pk=older.supersedes_id)
        chain.add(older.pk)
    newer = report
    while (newer := Report.objects.only("pk").filter(supersedes=newer).first()) is not None:
        chain.add(newer.pk)
    measured = (Dispute.objects.select_related("reaudit__result_report")
                .filter(report_id__in=chain, reaudit__status=ReauditStatus.COMPLETED).order_by("created_at"))
    return next((d for d in measured if d.reaudit.result_report is not None and figure_stands(d.reaudit.result_report)),
                None)


def _reason(reason: str, what: str) -> str:
    text = (reason or "").strip()
    if not text:
        raise ReportRefused("invalid_reason", f"say why you ask for a {what} (what looks wrong, what changed).")
    if len(text) > MAX_REASON_CHARS:
        raise ReportRefused("invalid_reason",
                            f"the reason is {len(text)} characters; keep it under {MAX_REASON_CHARS}.")
    return text
