"""Writes for runs: start, claim, progress, finish, cancel and reap, all as conditional updates.

Every transition is `UPDATE ... WHERE status IN (allowed sources)`, so a task delivered twice,
a cancel racing a finish, or a reaper racing a heartbeat can never move a run backwards.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
from datetime import timedelta
from typing import Any

import kombu.exceptions
from django.conf import settings
from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import Organization
from accounts.selectors import Actor
from accounts.throttle import QuotaExceeded
from auditlog.services import audit_record
from catalog.models import ModelVersion
from dyno.dispatch import RUN_EXECUTE, report_enqueue, send
from runs.figures import FIGURE_COLUMN, model_stable
from runs.models import Run, RunEvent, RunKind, WorkloadResult
from runs.shapes import MAX_BATCH, MAX_SEQ
from runs.signals import run_ended_without_result
from runs.status import FINISHED, Stage, Status, sources_of
from runners.names import workload_names

log = logging.getLogger(__name__)

PROFILES = ("cpu-ci", "cpu", "gpu")


class RunRejected(ValueError):
    """A run request that cannot be honoured; the message says what to change."""


class RunCancelled(Exception):
    """Raised inside a worker when the run it is executing was cancelled (or taken from it)."""


def _transition(run_id, target: str, **fields: Any) -> bool:
    return Run.objects.filter(pk=run_id, status__in=sources_of(target)).update(status=target, **fields) == 1


def run_log(run_id, message: str, *, level: str = "info", stage: str = "") -> None:
    RunEvent.objects.create(run_id=run_id, message=message[:4000], level=level, stage=stage)


def _active_runs_quota(*, organization_id: int, hardware: str) -> None:
    """Refuse (409, QuotaExceeded) a run past DYNO_QUOTA_ACTIVE_RUNS queued or running on one
    hardware class for one organization. Call inside the transaction that creates the run: the
    organization's row lock makes concurrent starts count one after another."""
    Organization.objects.select_for_update(no_key=True).filter(pk=organization_id).first()
    limit = settings.DYNO_QUOTA_ACTIVE_RUNS
    active = Run.objects.filter(organization_id=organization_id, hardware=hardware,
                                status__in=(Status.QUEUED, Status.RUNNING)).count()
    if active >= limit:
        raise QuotaExceeded(
            f"Your organization has reached its limit of {limit} runs queued or running at once on {hardware} "
            f"({active} now): wait for one to finish or cancel one, then start this again. Dyno's operators can "
            "raise the limit.", retry_after=None, status=409)


def run_start(*, actor: Actor, version: ModelVersion, hardware: str, profile: str = "cpu-ci",
              batch: int = 1, seq: int = 32) -> Run:
    if hardware not in settings.DYNO_HARDWARE_CLASSES:
        raise RunRejected(f"hardware class {hardware!r} is unknown: choose one of "
                          f"{', '.join(settings.DYNO_HARDWARE_CLASSES)}.")
    if profile not in PROFILES:
        raise RunRejected(f"profile {profile!r} is unknown: choose one of {', '.join(PROFILES)}.")
    if not (1 <= batch <= MAX_BATCH) or not (1 <= seq <= MAX_SEQ):
        raise RunRejected(f"batch must be 1..{MAX_BATCH} and seq 1..{MAX_SEQ} (got batch={batch}, seq={seq}).")
    org_id = version.model.organization_id
    if not actor.can_write(org_id):
        raise RunRejected("your role can read this organization's models but not start runs.")
    cap = settings.DYNO_RUN_MAX_PARAMETERS.get(hardware, settings.DYNO_RUN_MAX_PARAMETERS_DEFAULT)
    if version.parameter_count and version.parameter_count > cap:
        raise RunRejected(f"this model has {version.parameter_count:,} parameters; runs on {hardware} measure at most "
                          f"{cap:,} (three copies are measured side by side). Choose a larger hardware class.")
    with transaction.atomic():
        _active_runs_quota(organization_id=org_id, hardware=hardware)
        run = Run.objects.create(organization_id=org_id, model_version=version, hardware=hardware,
                                 profile=profile, batch=batch, seq=seq, created_by=actor.audit_label)
        run_log(run.pk, f"queued on {hardware} (profile {profile}, batch {batch}, seq {seq})")
        audit_record(action="run.started", actor=actor, organization_id=org_id, target=f"run:{run.pk}",
                     data={"model_version": str(version.pk), "hardware": hardware, "profile": profile})
        transaction.on_commit(lambda: run_enqueue(run))
    return run


MAX_CANDIDATE_BYTES = 256 * 1024


def _check_candidate_source(source: str) -> None:
    """Parse (never run) the module here: enough to refuse what cannot be a candidate."""
    if not source.strip():
        raise RunRejected("the candidate module is empty: upload a .py file that defines kernel(*inputs).")
    if len(source.encode()) > MAX_CANDIDATE_BYTES:
        raise RunRejected(f"the candidate module is over {MAX_CANDIDATE_BYTES // 1024} KiB; "
                          "keep generated tables out of it.")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise RunRejected(f"the candidate module is not valid Python (line {exc.lineno}: {exc.msg}).") from None
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name)}
    if "kernel" not in names:
        raise RunRejected("the candidate module defines no top-level `kernel`: define "
                          "`def kernel(*inputs)` taking the workload's inputs in the baseline's order.")


def audit_start(*, actor: Actor, organization_id: int, workload: str, source: str, hardware: str,
                profile: str = "cpu-ci") -> Run:
    """Bring your own kernel: audit a submitted candidate module for one suite workload."""
    if workload not in workload_names():
        raise RunRejected(f"workload {workload!r} is not in the suite: choose one of {', '.join(workload_names())}.")
    if hardware not in settings.DYNO_HARDWARE_CLASSES:
        raise RunRejected(f"hardware class {hardware!r} is unknown: choose one of "
                          f"{', '.join(settings.DYNO_HARDWARE_CLASSES)}.")
    if profile not in PROFILES:
        raise RunRejected(f"profile {profile!r} is unknown: choose one of {', '.join(PROFILES)}.")
    if not actor.can_write(organization_id):
        raise RunRejected("your role cannot submit candidates for audit.")
    _check_candidate_source(source)
    digest = hashlib.sha256(source.encode()).hexdigest()
    with transaction.atomic():
        _active_runs_quota(organization_id=organization_id, hardware=hardware)
        run = Run.objects.create(organization_id=organization_id, kind=RunKind.AUDIT, workload=workload,
                                 candidate_source=source, candidate_sha256=digest, hardware=hardware,
                                 profile=profile, created_by=actor.audit_label)
        run_log(run.pk, f"audit of a {workload} candidate (sha256 {digest[:12]}) queued on {hardware}")
        audit_record(action="audit.started", actor=actor, organization_id=organization_id,
                     target=f"run:{run.pk}", data={"workload": workload, "sha256": digest,
                                                   "hardware": hardware, "profile": profile})
        transaction.on_commit(lambda: run_enqueue(run))
    return run


def run_repeat(*, run: Run, requested_by: str, why: str) -> Run:
    """A new queued run that measures again what `run` measured, on the runners serving now.

    Same subject (the model version and the artifact its run measured, replayed without tuning;
    or the workload and the candidate source verbatim), hardware class, profile, batch and seq. The platform starts it for a request someone was already
    allowed to make (a re-audit), so no role is checked here.
    """
    if run.hardware not in settings.DYNO_HARDWARE_CLASSES:
        raise RunRejected(f"hardware class {run.hardware!r} is no longer served (now: "
                          f"{', '.join(settings.DYNO_HARDWARE_CLASSES)}); it cannot be measured there again.")
    with transaction.atomic():
        repeat = Run.objects.create(
            organization_id=run.organization_id, kind=run.kind, model_version_id=run.model_version_id,
            workload=run.workload, candidate_source=run.candidate_source, candidate_sha256=run.candidate_sha256,
            hardware=run.hardware, profile=run.profile, batch=run.batch, seq=run.seq,
            created_by=requested_by[:254], repeat_of=run)
        run_log(repeat.pk, f"{why}: measures again what run {run.pk} measured, queued on {run.hardware} "
                           f"(profile {run.profile}, batch {run.batch}, seq {run.seq})")
        audit_record(action="run.repeated", organization_id=run.organization_id, target=f"run:{repeat.pk}",
                     data={"of": str(run.pk), "why": why, "kind": run.kind, "hardware": run.hardware})
        transaction.on_commit(lambda: run_enqueue(repeat))
    return repeat


def run_enqueue(run: Run) -> None:
    """Send the run to its hardware class's queue (on commit).

    The message carries no time limits, so the executing worker's own settings decide them (Celery
    would otherwise stamp the sender's). A broker still unreachable after the publish's own retries
    fails the run with a message that says so: the row exists either way, and a queued run with no
    message behind it would wait for good.
    """
    try:
        send(RUN_EXECUTE, str(run.pk), queue=run.hardware, time_limit=None, soft_time_limit=None)
    except kombu.exceptions.OperationalError as exc:
        log.error("run %s could not be queued: %s", run.pk, exc)
        run_fail(run_id=run.pk, error=f"the job queue was unreachable when this run was queued ({exc}); "
                                      "nothing ran. Start it again.")


def run_claim(*, run_id, worker: str) -> bool:
    """Move a queued run to running for this worker. False if it is not queued any more."""
    now = timezone.now()
    with transaction.atomic():  # claimed and counted together, so a retried claim sees one or the other
        claimed = _transition(run_id, Status.RUNNING, worker=worker, started_at=now, heartbeat_at=now,
                              stage=Stage.PROFILE)
        if claimed:
            Run.objects.filter(pk=run_id).update(attempts=F("attempts") + 1)
            run_log(run_id, f"claimed by {worker}", stage=Stage.PROFILE)
    return claimed


def run_progress(*, run_id, worker: str, fraction: float, message: str = "", stage: str | None = None) -> None:
    """Record progress; raises RunCancelled if the run is no longer running on this worker."""
    fields: dict[str, Any] = {"progress": max(0.0, min(1.0, fraction)), "heartbeat_at": timezone.now()}
    if stage:
        fields["stage"] = stage
    updated = Run.objects.filter(pk=run_id, status=Status.RUNNING, worker=worker).update(**fields)
    if updated != 1:
        raise RunCancelled(f"run {run_id} is no longer running on {worker}")
    if message:
        run_log(run_id, message, stage=stage or "")


def _finite_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def _interval_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, list) and len(value) == 2 and all(_finite_or_none(v) for v in value))


def _speedup_bound() -> float:
    """The first speedup a report's figure columns cannot hold (runs.figures.FIGURE_COLUMN): a
    result past it was stored, and then no report could ever be made of its run (red team 16,
    2026-12-06: a CI of [1e7, 2e7] from a runner, the report sweep retrying it for good)."""
    return float(10 ** (FIGURE_COLUMN["max_digits"] - FIGURE_COLUMN["decimal_places"]))


def _figure_fits(value: Any) -> bool:
    return value is None or 0 <= value < _speedup_bound()


def _stored(field: str, model: type[models.Model] = WorkloadResult) -> int:
    """How many characters the column that stores `field` holds (the one place that says so)."""
    return model._meta.get_field(field).max_length


def _text_problem(block: dict[str, Any], where: str, limits: dict[str, int]) -> str | None:
    for name, limit in limits.items():
        value = block.get(name)
        if name in block and not (isinstance(value, str) and len(value) <= limit):
            return f"{where}.{name} must be a string of at most {limit} characters"
    return None


def result_problem(result: dict[str, Any]) -> str | None:
    """What in a result document does not fit what a succeeded run stores (runs.models.Run and
    WorkloadResult), in words, or None: checked before anything is written, so a malformed
    document is refused whole instead of failing half-way (a red team's `ci95: [1.2]`, 2026-12-06)."""
    workloads = result.get("workloads", [])
    if not isinstance(workloads, list):
        return "`workloads` must be a list"
    for index, entry in enumerate(workloads):
        where = f"workloads[{index}]"
        if not isinstance(entry, dict):
            return f"{where} must be an object"
        name = entry.get("name")
        if not (isinstance(name, str) and 0 < len(name) <= _stored("name")):
            return f"{where}.name must be a string of 1 to {_stored('name')} characters"
        # `key` is not stored (it names the entry in the model's weighting): bounded all the same.
        problem = _text_problem(entry, where, {"key": 200, **{f: _stored(f) for f in ("family", "dtype", "verdict")}})
        if problem:
            return problem
        if not _finite_or_none(entry.get("speedup")) or not _interval_or_none(entry.get("ci95")):
            return f"{where}: `speedup` must be a finite number or null and `ci95` two of them or null"
        if not all(_figure_fits(v) for v in (entry.get("speedup"), *(entry.get("ci95") or ()))):
            return f"{where}: `speedup` and `ci95` must lie between 0 and {_speedup_bound():.0f}"
        for side in ("baseline", "candidate"):
            block = entry.get(side)
            if block is not None and not (isinstance(block, dict) and _finite_or_none(block.get("median_s"))):
                return f"{where}.{side} must be an object whose `median_s` is a finite number or null"
        digest = (entry.get("candidate") or {}).get("source_sha256")
        if digest is not None and not (isinstance(digest, str) and len(digest) <= _stored("candidate_sha256")):
            return f"{where}.candidate.source_sha256 must be a hex digest"
        for field, kind in (("shape", dict), ("reasons", list), ("reference_points", dict)):
            if field in entry and not isinstance(entry[field], kind):
                return f"{where}.{field} must be {'an object' if kind is dict else 'a list'}"
    model = result.get("model")
    if model is not None:
        if not isinstance(model, dict):
            return "`model` must be an object or null"
        if not all(_finite_or_none(model.get(name)) for name in ("speedup", "baseline_s", "optimized_s")) \
                or not _interval_or_none(model.get("ci95")):
            return "model: `speedup`, `baseline_s` and `optimized_s` must be finite numbers or null, `ci95` two of them"
        if not all(_figure_fits(v) for v in (model.get("speedup"), *(model.get("ci95") or ()))):
            return f"model: `speedup` and `ci95` must lie between 0 and {_speedup_bound():.0f}"
        problem = _text_problem(model, "model", {f: _stored(f) for f in ("dtype", "verdict")})
        if problem:
            return problem
        for field, kind in (("shape", dict), ("reasons", list), ("weighting", list)):
            if field in model and model[field] is not None and not isinstance(model[field], kind):
                return f"model.{field} must be {'an object' if kind is dict else 'a list'}"
        for index, weight in enumerate(model.get("weighting") or []):
            if not (isinstance(weight, dict) and isinstance(weight.get("key", ""), str)
                    and isinstance(weight.get("count", 1), int) and not isinstance(weight.get("count", 1), bool)
                    and 0 < weight.get("count", 1) < 2**31 and _finite_or_none(weight.get("weight", 0.0))):
                return f"model.weighting[{index}] must be an object with a `key`, a positive integer `count` and a number `weight`"
    for name in ("environment", "sandbox", "suite"):
        if result.get(name) is not None and not isinstance(result[name], dict):
            return f"`{name}` must be an object"
    verdict = result.get("verdict", "")
    if not (isinstance(verdict, str) and len(verdict) <= _stored("verdict", Run)):
        return f"`verdict` must be a string of at most {_stored('verdict', Run)} characters"
    return None


def _workload_rows(run_id, result: dict[str, Any], weights: dict[str, tuple[int, float]]) -> list[WorkloadResult]:
    rows = []
    for entry in result.get("workloads", []):
        ci = entry.get("ci95") or [None, None]
        count, weight = weights.get(entry.get("key") or entry["name"], (1, 0.0))
        rows.append(WorkloadResult(
            run_id=run_id, name=entry["name"], family=entry.get("family", ""), shape=entry.get("shape", {}),
            dtype=entry.get("dtype", ""), count=count, weight=weight,
            baseline_median_s=(entry.get("baseline") or {}).get("median_s"),
            candidate_median_s=(entry.get("candidate") or {}).get("median_s"),
            speedup=entry.get("speedup"), ci_low=ci[0], ci_high=ci[1], verdict=entry.get("verdict", "error"),
            reasons=entry.get("reasons", []), reference_points=entry.get("reference_points", {}),
            candidate_sha256=(entry.get("candidate") or {}).get("source_sha256", "") or "",
        ))
    model = result.get("model")
    if model:
        ci = model.get("ci95") or [None, None]
        rows.append(WorkloadResult(
            run_id=run_id, name="model", family="model", shape=model.get("shape", {}),
            dtype=model.get("dtype", ""), weight=1.0, baseline_median_s=model.get("baseline_s"),
            candidate_median_s=model.get("optimized_s"), speedup=model.get("speedup"), ci_low=ci[0],
            ci_high=ci[1], verdict=model.get("verdict", "accepted"), reasons=model.get("reasons", []),
            is_model=True,
        ))
    return rows


def artifact_bytes(artifact: dict[str, Any]) -> bytes:
    """The bytes of an artifact that its `artifact_sha256` hashes and its download serves: sorted
    keys, no whitespace (what a report's recipe checks with sha256sum)."""
    return json.dumps(artifact, sort_keys=True, separators=(",", ":")).encode()


def run_succeed(*, run_id, worker: str, inventory: dict[str, Any] | None = None,
                result: dict[str, Any] | None = None, artifact: dict[str, Any] | None = None) -> bool:
    """Store everything a run produced and finish, in one transaction: all at once or not at all.

    `result` is a dyno.suite-result/1 document (plus the model-level block for model runs); a
    succeeded run with a result gets its signed report made on the control queue.
    """
    fields: dict[str, Any] = {"status": Status.SUCCEEDED, "stage": Stage.DONE, "progress": 1.0,
                              "finished_at": timezone.now()}
    if inventory is not None:
        fields["inventory"] = inventory
    if artifact is not None:
        fields["artifact"] = artifact
        fields["artifact_sha256"] = hashlib.sha256(artifact_bytes(artifact)).hexdigest()
    if result is not None:
        problem = result_problem(result)
        if problem is not None:
            raise ValueError(f"the result document does not fit: {problem}")
        model = result.get("model") or {}
        ci = model.get("ci95") or [None, None]
        fields.update(result=result, stable=model_stable(result),
                      model_speedup=model.get("speedup"), model_ci_low=ci[0], model_ci_high=ci[1],
                      verdict=result.get("verdict", ""))
    with transaction.atomic():
        done = Run.objects.filter(pk=run_id, status=Status.RUNNING, worker=worker).update(**fields)
        if done and result is not None:
            weights = {w["key"]: (w.get("count", 1), w.get("weight", 0.0))
                       for w in (model or {}).get("weighting", []) if "key" in w}
            WorkloadResult.objects.bulk_create(_workload_rows(run_id, result, weights))
            report_enqueue(run_id)
        if done:
            run_log(run_id, "succeeded", stage=Stage.DONE)
    return done == 1


def run_fail(*, run_id, error: str, worker: str | None = None) -> bool:
    query = Run.objects.filter(pk=run_id, status__in=sources_of(Status.FAILED))
    if worker is not None:
        query = query.filter(worker=worker)
    with transaction.atomic():
        done = query.update(status=Status.FAILED, error=error[:4000], finished_at=timezone.now())
        if done:
            run_log(run_id, f"failed: {error}", level="error")
            _reaudit_ended(run_id, f"the re-audit run {run_id} failed: {error}")
    return done == 1


def _reaudit_ended(run_id, error: str) -> None:
    """A run ended without a result: a re-audit waiting on it fails with the reason (reports listens)."""
    run_ended_without_result.send(sender=Run, run_id=run_id, error=error)


def run_cancel_refusal(*, actor: Actor, run: Run) -> str | None:
    """Why `actor` may not cancel `run`, or None if they may.

    A re-audit run (asked for by an auditor or by a customer's dispute) measures a result someone
    contests: neither party may withdraw it half-way, so only an operator can stop one."""
    if Run.objects.filter(pk=run.pk, reaudit_request__isnull=False).exists():
        if actor.is_staff:
            return None
        return ("this run re-audits a signed report (for an auditor or a dispute), and only an operator can "
                "stop it: a contested measurement is not withdrawn by either party.")
    if not actor.can_write(run.organization_id):
        return "your role cannot cancel runs."
    return None


def run_cancel(*, actor: Actor, run: Run) -> bool:
    refusal = run_cancel_refusal(actor=actor, run=run)
    if refusal:
        raise RunRejected(refusal)
    if run.status in FINISHED:
        raise RunRejected(f"the run already {run.status}; there is nothing to cancel.")
    with transaction.atomic():
        done = _transition(run.pk, Status.CANCELLED, finished_at=timezone.now())
        if done:
            run_log(run.pk, f"cancelled by {actor.audit_label}", level="warning")
            audit_record(action="run.cancelled", actor=actor, organization_id=run.organization_id,
                         target=f"run:{run.pk}")
            _reaudit_ended(run.pk, f"the re-audit run {run.pk} was cancelled by {actor.audit_label}")
    return done


def runs_reap_stale(*, now=None, stale_seconds: int | None = None) -> list[str]:
    """Fail running runs whose worker stopped heartbeating; returns the ids reaped."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=stale_seconds or settings.DYNO_RUN_STALE_SECONDS)
    reaped = []
    for run in Run.objects.filter(status=Status.RUNNING, heartbeat_at__lt=cutoff).only("id", "worker"):
        if run_fail(run_id=run.pk, worker=run.worker,
                    error=f"worker {run.worker or '?'} stopped sending heartbeats; the run was abandoned. "
                          "Start it again."):
            reaped.append(str(run.pk))
    if reaped:
        log.warning("reaped %d stale runs: %s", len(reaped), ", ".join(reaped))
    return reaped


def runs_resend_unclaimed(*, now=None, after_seconds: int | None = None) -> list[str]:
    """Send again the queued runs that no worker claimed and nothing touched for `after_seconds`.

    A broker that restarts without persistence loses the messages it held, and their runs would
    stay queued for good. Sending again is safe: the claim is a conditional update, so a run whose
    first message is still in the queue is executed once and the other delivery finds it taken.
    The re-send is logged on the run, which also spaces re-sends `after_seconds` apart."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=after_seconds or settings.DYNO_RUN_RESEND_SECONDS)
    resent = []
    for run in Run.objects.filter(status=Status.QUEUED, created_at__lt=cutoff).exclude(events__at__gte=cutoff):
        run_log(run.pk, "no worker claimed this run for a while (a lost queue message?); sent to the queue again",
                level="warning")
        run_enqueue(run)
        resent.append(str(run.pk))
    if resent:
        log.warning("re-sent %d unclaimed runs: %s", len(resent), ", ".join(resent))
    return resent


def runs_fail_held_by(*, worker: str) -> list[str]:
    """A worker that (re)starts holds nothing: whatever was running under its name died with it."""
    failed = []
    for run in Run.objects.filter(status=Status.RUNNING, worker=worker).only("id"):
        if run_fail(run_id=run.pk, worker=worker,
                    error=f"worker {worker} restarted while running this run. Start it again."):
            failed.append(str(run.pk))
    return failed


def runs_heartbeat(*, worker: str, executing: set[str] | None = None) -> None:
    """Keep alive the runs `worker` holds; with `executing`, only those it is executing now.

    A run the worker holds but no longer executes (its task ended while the database was away,
    so its outcome was never written) then goes stale, and the reaper fails it."""
    runs = Run.objects.filter(status=Status.RUNNING, worker=worker)
    if executing is not None:
        runs = runs.filter(pk__in=list(executing))
    runs.update(heartbeat_at=timezone.now())
