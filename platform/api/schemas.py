"""The typed shapes of the API: what every endpoint reads and answers, as pydantic models. The
OpenAPI document (/api/v1/openapi.json) is generated from these by django-ninja, and every answer is
validated against its model before it leaves, so the document and the API cannot drift apart: a
serializer that grows a key its model lacks fails (a logged 500 in tests), it is not sent unnamed.

Conventions: answers derive from `Out` (unknown keys refused); ids and times stay the strings the
serializers write (`Id`, `Moment`: no re-formatting), and a key that an answer carries only
sometimes is `Optional[...] = None` and left out when absent (operations dump with exclude_unset).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model

from api.pagination import DEFAULT_LIMIT, MAX_LIMIT

Id = Annotated[str, Field(json_schema_extra={"format": "uuid"})]
Moment = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
Day = Annotated[str, Field(json_schema_extra={"format": "date"})]
# Money and rates travel as decimal strings (never floats): "1234.50".
Money = Annotated[str, Field(pattern=r"^-?\d+(\.\d+)?$", examples=["1234.50"])]


class Out(BaseModel):
    """An answer's shape: a key not declared here is a bug, not a silent extra."""

    model_config = ConfigDict(extra="forbid")


class In(BaseModel):
    """A request body's shape: unknown keys are refused with the key's name, not ignored."""

    model_config = ConfigDict(extra="forbid")


class ErrorBody(Out):
    code: str = Field(description="stable, machine-readable: e.g. not_found, invalid_field, forbidden_scope")
    message: str = Field(description="what was wrong and what to do, in words")


class Error(Out):
    """Every refusal, whatever its status: {"error": {"code", "message"}}."""

    error: ErrorBody


class PageQuery(BaseModel):
    """The query of every list (api/pagination.py): newest first by (created_at, id)."""

    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="rows on this page")
    cursor: Optional[str] = Field(None, description="the previous page's `next`, unchanged; leave it out for the "
                                                    "first page")


def page_model(name: str, key: str, item: type[BaseModel], **extra: Any) -> type[Out]:
    """The model of one page of a list: its rows under `key` and the next page's cursor (`extra`:
    further keys as create_model takes them)."""
    return create_model(name, __base__=Out,
                        **{key: (list[item], ...),
                           "next": (Optional[str], Field(..., description="pass as `cursor` for the next page; "
                                                                           "null on the last"))},
                        **extra)


# -- models, versions, runs (api/views.py) --------------------------------------------------------

class ModelFile(Out):
    path: str
    size: int
    sha256: str


class ModelVersion(Out):
    id: Id
    model: Id
    number: int
    kind: Literal["weights", "card"]
    family: str
    architecture: str
    parameter_count: int
    dtype: str
    total_bytes: int
    created_at: Moment
    files: Optional[list[ModelFile]] = Field(None, description="on a version's own answer only")


class Model(Out):
    id: Id
    name: str
    created_at: Moment
    versions: Optional[list[ModelVersion]] = Field(None, description="on a model's own answer only")


class RunRequest(In):
    model_version: Id
    hardware: str = Field(examples=["cpu", "gpu-h100", "gpu-h200"])
    profile: Literal["cpu-ci", "cpu", "gpu"] = "cpu-ci"
    batch: int = Field(1, ge=1)
    seq: int = Field(32, ge=1)


class AuditJson(In):
    """An audit as JSON: the candidate module as text."""

    workload: str = Field(description="a suite workload, e.g. rmsnorm")
    source: str = Field(description="the candidate module, UTF-8 text")
    hardware: str = "cpu"
    profile: Literal["cpu-ci", "cpu", "gpu"] = "cpu-ci"


class RunLinks(Out):
    self: str
    page: str
    result: Optional[str] = Field(None, description="the stored result document, once there is one")
    artifact: Optional[str] = Field(None, description="the optimization artifact, once there is one")


class ModelFigure(Out):
    """The whole model's figure: the one that bills."""

    speedup: Optional[float]
    ci95: list[Optional[float]] = Field(min_length=2, max_length=2)
    stable: Optional[bool]


class Reason(Out):
    code: str
    message: str


class WorkloadRow(Out):
    name: str
    shape: dict[str, Any]
    dtype: str
    verdict: str
    speedup: Optional[float]
    ci95: list[Optional[float]] = Field(min_length=2, max_length=2)
    reasons: list[Reason]
    weight: float


class RunEvent(Out):
    at: Moment
    level: str
    stage: str
    message: str


class Run(Out):
    id: Id
    kind: Literal["model", "audit"]
    model_version: Optional[Id]
    workload: Optional[str] = Field(description="an audit's suite workload")
    candidate_sha256: Optional[str]
    verdict: Optional[str]
    hardware: str
    profile: str
    batch: int
    seq: int
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    stage: str
    progress: float = Field(ge=0, le=1)
    error: Optional[str]
    created_at: Moment
    started_at: Optional[Moment]
    finished_at: Optional[Moment]
    links: RunLinks
    model: Optional[ModelFigure] = None
    workloads: Optional[list[WorkloadRow]] = Field(None, description="once the run has a result")
    inventory: Optional[dict[str, Any]] = Field(None, description="dyno.inventory/1: the model's workloads")
    events: Optional[list[RunEvent]] = Field(None, description="on a run's own answer only")


ModelPage = page_model("ModelPage", "models", Model)
RunPage = page_model("RunPage", "runs", Run)
