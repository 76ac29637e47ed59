"""The typed shapes of the report endpoints (reports/api.py) under /api/v1/reports: what the
serializers there and reports/compare.reaudit_dict build, key for key, in the order they build it.

Conventions as api/schemas.py: answers derive from `Out` (unknown keys refused), ids and times stay
the strings the serializers write, a key that is always sent is required (`Optional[X]` when it may
be null) and a key sent only sometimes is `Optional[X] = None`. Names are prefixed (Report...,
Reaudit...) because every app's models share one components section of the document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import Id, Moment, Out, page_model
from reports.services import MAX_REASON_CHARS

# A figure copied out of the signed body into a DecimalField (6 places), sent as its decimal text.
Decimal6 = Annotated[str, Field(pattern=r"^-?\d+(\.\d+)?$", examples=["1.220000"],
                                description="a decimal as text (6 places), never a float")]
ReauditStatus = Literal["requested", "running", "completed", "failed"]
# What a changed environment key held: a leaf of the signed body's `environment` (flattened: nested
# objects become dotted keys, lists stay whole), null where that report lacks the key.
EnvironmentValue = Union[str, int, float, bool, list[Any], None]


# -- the list ---------------------------------------------------------------------------------------

class ReportAuditor(Out):
    """Someone Dyno's operator appointed to audit the organization (a person or an auditor key)."""

    kind: Literal["person", "key"]
    label: str = Field(description="a person's e-mail; a key's name and public prefix (never the secret)")
    since: Moment


class ReportLinks(Out):
    body: str = Field(description="the signed bytes (GET /reports/{report_id})")
    signature: str = Field(description="the detached signature (GET /reports/{report_id}/signature)")
    page: str = Field(description="the report's web page")
    keys: str = Field(description="the public keys that verify it (/.well-known/dyno-report-keys.json)")


class Report(Out):
    """A signed report's index card: figures copied out of the signed body, which stays the source of
    truth (read it at `links.body`)."""

    id: Id
    kind: Literal["run", "audit", "reaudit"]
    organization: str = Field(description="the organization's slug")
    run: Optional[Id]
    hardware: str
    body_sha256: str = Field(description="SHA-256 of the signed bytes, hex")
    key_id: str = Field(description="the signing key's id")
    model_speedup: Optional[Decimal6]
    model_ci_low: Optional[Decimal6]
    model_ci_high: Optional[Decimal6]
    stable: bool = Field(description="the A/A calibration was stable: the figures are billable")
    supersedes: Optional[Id] = Field(description="the report this re-audit measured again")
    created_at: Moment
    auditors: list[ReportAuditor]
    links: ReportLinks


ReportPage = page_model("ReportPage", "reports", Report)


class ReportBody(BaseModel):
    """A report body, dyno.report/1: canonical JSON, answered as the exact bytes that were signed (never
    re-serialized, so never validated against this model). Verify those bytes as received; what the
    body holds is the report schema's (reports/document.py), open here."""

    model_config = ConfigDict(extra="allow", json_schema_extra={
        "properties": {"schema": {"const": "dyno.report/1", "description": "the body's schema"}},
        "required": ["schema"]})


class ReportSignature(Out):
    """The detached signature file, as `python -m proof verify` reads it."""

    key_id: str
    algorithm: Literal["ed25519"]
    signature: str = Field(description="base64 Ed25519 signature of the body bytes exactly as served")


# -- re-audits --------------------------------------------------------------------------------------

class ReauditRequest(Out):
    """A re-audit asked of a report (by an auditor, Dyno's operator, or a customer's dispute)."""

    id: Id
    status: ReauditStatus
    report: Id
    requested_by: str
    reason: str
    created_at: Moment
    run: Optional[Id] = Field(description="the run measuring it again, once started")
    result_report: Optional[Id] = Field(description="the re-audit's report, once completed")
    error: Optional[str] = Field(description="why it failed")


class ReauditRequested(Out):
    """The request a POST made, or the open one it joined."""

    id: Id
    status: ReauditStatus
    report: Id
    requested_by: str
    created_at: Moment


class ReauditFigureSide(Out):
    speedup: Optional[float]
    ci95: Optional[Annotated[list[float], Field(min_length=2, max_length=2)]] = Field(description="[low, high]")
    verdict: Optional[str] = Field(description="a workload's verdict; null for the whole model")


class ReauditFigure(Out):
    """One speedup in both reports."""

    label: str
    whole_model: bool
    original: ReauditFigureSide
    reaudit: ReauditFigureSide
    difference: Optional[float] = Field(description="re-audit minus original; null unless both were measured")
    difference_percent: Optional[float]
    within_original_ci: Optional[bool] = Field(description="the re-audit's speedup lies inside the original 95% CI; "
                                                           "null where either side lacks the figure")
    intervals_overlap: Optional[bool]


class EnvironmentChange(Out):
    key: str = Field(description="a dotted key of the signed body's `environment`")
    original: EnvironmentValue
    reaudit: EnvironmentValue


class ReauditComparison(Out):
    """A re-audit report beside the report it measured again, figure by figure."""

    original: Id
    reaudit: Id
    all_within_original_ci: bool = Field(description="every figure measured on both sides lies inside the "
                                                     "original 95% CI (false when none was)")
    figures: list[ReauditFigure] = Field(description="the whole model's figure (where either has one), then "
                                                     "every workload")
    warnings: list[str]
    environment_changes: list[EnvironmentChange]


class ReportReaudits(Out):
    report: Id
    reaudits: list[ReauditRequest] = Field(description="newest first")
    superseded_by: Optional[ReauditComparison] = Field(description="this report beside the re-audit that "
                                                                   "superseded it")
    supersedes: Optional[ReauditComparison] = Field(description="for a re-audit report: the report it "
                                                                "re-measured beside it")


# -- disputes ---------------------------------------------------------------------------------------

class ReportDispute(Out):
    id: Id
    status: Literal["open", "resolved"]
    report: Id
    reaudit: Id = Field(description="the re-audit request it asked for or joined")
    created_at: Moment


# -- request bodies (read by the views themselves: see reports/api.py) ------------------------------

class ReportReason(BaseModel):
    """Why a dispute or re-audit is asked. The view reads it itself so that who may ask (403) is
    decided before what was sent (400 `invalid_reason`); other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS,
                        description="what looks wrong or what changed; blank (whitespace only) is refused")
