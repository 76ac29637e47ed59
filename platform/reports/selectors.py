"""Reads of reports through the acting user's or key's organizations, and signature checks.

Members and auditors assigned to an organization (Membership role auditor) see its reports;
staff see all; anyone else gets a 404, never another organization's report.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from dataclasses import dataclass

from django.db.models import Case, QuerySet, Value, When
from django.shortcuts import get_object_or_404

from accounts.models import ApiKey, Membership, Role, Scope
from accounts.selectors import Actor
from api.bounded import MAX_DEPTH, InputRejected, json_loads_bounded
from reports.models import OPEN_REAUDIT, ReauditRequest, ReauditStatus, Report
from reports.signing import keys_document
from proof.signature import VerifyReason, VerifyResult, verify
from runs.models import Run
from runs.status import Status


def report_list(*, actor: Actor) -> QuerySet[Report]:
    reports = Report.objects.select_related("organization", "run", "run__model_version",
                                            "run__model_version__model").defer("body")
    if actor.is_staff:
        return reports
    return reports.filter(organization_id__in=actor.org_ids)


def report_get(*, actor: Actor, report_id) -> Report:
    return get_object_or_404(report_list(actor=actor).defer(None), pk=report_id)


def signature_document(report: Report) -> dict[str, str]:
    """The detached signature file of a report, as `python -m proof verify` reads it."""
    return {"key_id": report.key_id, "algorithm": "ed25519", "signature": report.signature}


def report_verify(*, report: Report) -> VerifyResult:
    """Whether the stored bytes still verify against the keys published now (revocation included)."""
    return verify(report.body_bytes, signature_document(report), keys_document())


# What /verify reads of each file. A report body is tens of KiB and its signature file 200 bytes;
# the page refuses more before the request body is read (reports/views.py).
VERIFY_FILE_MAX_BYTES = 2**20
_SIGNATURE_PROBLEM = {"too_large": f"is over {VERIFY_FILE_MAX_BYTES // 2**20} MiB",
                      "too_deep": f"nests more than {MAX_DEPTH} levels"}


def files_verify(*, body: bytes, signature: bytes) -> VerifyResult:
    """Check an uploaded report file and signature file against the published keys (the /verify page).

    Only the signature file is parsed (bounded: a hostile one is refused, never recursed into); the
    report is checked as the bytes it is, which is what the signature covers.
    """
    try:
        signature_doc = json_loads_bounded(signature, max_bytes=VERIFY_FILE_MAX_BYTES, what="the signature file")
    except InputRejected as exc:
        problem = _SIGNATURE_PROBLEM.get(exc.code, "is not JSON")
        return VerifyResult(valid=False, reason=VerifyReason.MALFORMED_SIGNATURE,
                            message=f"the signature file {problem}, so it is not a Dyno signature; download it "
                                    "again from the report page")
    return verify(body, signature_doc, keys_document())


@dataclass(frozen=True)
class Auditor:
    """Someone the operator appointed to audit an organization: a person or an auditor API key."""

    kind: str  # "person" or "key"
    label: str  # a person's e-mail; a key's name and public prefix (never the secret)
    since: datetime


def report_auditors(report: Report) -> list[Auditor]:
    """Who may re-audit `report` today: the auditor people and active auditor keys of its
    organization, all appointed by Dyno's operator (the organization cannot appoint its own)."""
    people = (Membership.objects.filter(organization_id=report.organization_id, role=Role.AUDITOR)
              .select_related("user").order_by("created_at"))
    keys = ApiKey.objects.filter(organization_id=report.organization_id, scope=Scope.AUDITOR,
                                 revoked_at__isnull=True).order_by("created_at")
    return ([Auditor("person", m.user.email or m.user.username, m.created_at) for m in people]
            + [Auditor("key", f"{k.name} ({k.prefix})", k.created_at) for k in keys])


def report_successor(report: Report) -> Report | None:
    return Report.objects.filter(supersedes=report).defer("body").first()


def reaudit_requests_pending() -> QuerySet[ReauditRequest]:
    """What the run pipeline should re-measure next, oldest first."""
    return (ReauditRequest.objects.filter(status=ReauditStatus.REQUESTED)
            .select_related("report", "report__run").order_by("created_at"))


def reaudit_neighbours(report: Report) -> tuple[Report | None, Report | None]:
    """The report `report` re-audited (when it is a re-audit) and the re-audit that superseded it,
    bodies loaded: what the report page and the API set beside it. Same organization by construction."""
    original = Report.objects.filter(pk=report.supersedes_id).first() if report.supersedes_id else None
    return original, Report.objects.filter(supersedes=report).first()


def reaudit_open_for(report: Report) -> ReauditRequest | None:
    return ReauditRequest.objects.filter(report=report, status__in=OPEN_REAUDIT).first()


def reaudit_requests_run_ended() -> QuerySet[ReauditRequest]:
    """Re-audits still marked running whose run failed or was cancelled (a missed settle)."""
    return (ReauditRequest.objects.filter(status=ReauditStatus.RUNNING,
                                          run__status__in=(Status.FAILED, Status.CANCELLED))
            .select_related("run").order_by("created_at"))


def reaudit_requests_of(report: Report) -> QuerySet[ReauditRequest]:
    """Every re-audit asked of `report`, newest first, with what it produced."""
    return ReauditRequest.objects.filter(report=report).order_by("-created_at")


# Runs that finished this recently come first, so older ones whose report keeps failing (the task
# logs why) never crowd out a fresh run's report.
MISSING_REPORT_RECENT = timedelta(days=1)


def runs_missing_report(*, before: datetime, limit: int = 100) -> list:
    """Ids of runs that succeeded with a result before `before` and have no report, however long ago:
    those that finished in the last day first, then the others; each group oldest first."""
    older = Case(When(finished_at__gte=before - MISSING_REPORT_RECENT, then=Value(0)), default=Value(1))
    return list(Run.objects.filter(status=Status.SUCCEEDED, result__isnull=False, reports__isnull=True,
                                   finished_at__lt=before)
                .order_by(older, "finished_at").values_list("pk", flat=True)[:limit])
