"""Plain dicts for the API (and the run page's polling): one shape per object, one place."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from catalog.models import Model, ModelVersion
from runs.models import Run


def model_version_dict(version: ModelVersion, *, with_files: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": str(version.id), "model": str(version.model_id), "number": version.number,
        "kind": version.kind, "family": version.family, "architecture": version.architecture,
        "parameter_count": version.parameter_count, "dtype": version.dtype,
        "total_bytes": version.total_bytes, "created_at": version.created_at.isoformat(),
    }
    if with_files:
        data["files"] = [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in version.files.all()]
    return data


def model_dict(model: Model, *, with_versions: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"id": str(model.id), "name": model.name, "created_at": model.created_at.isoformat()}
    if with_versions:
        data["versions"] = [model_version_dict(v) for v in model.versions.all()]
    return data


def run_dict(run: Run, *, with_events: bool = False) -> dict[str, Any]:
    # Not the worker: its node name is the runner's hostname, which customers have no use for and
    # an attacker would (the fleet page shows it to staff).
    data: dict[str, Any] = {
        "id": str(run.id), "kind": run.kind,
        "model_version": str(run.model_version_id) if run.model_version_id else None,
        "workload": run.workload or None, "candidate_sha256": run.candidate_sha256 or None,
        "verdict": run.verdict or None, "hardware": run.hardware,
        "profile": run.profile, "batch": run.batch, "seq": run.seq, "status": run.status,
        "stage": run.stage, "progress": round(run.progress, 4), "error": run.error or None,
        "created_at": run.created_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "links": {"self": reverse("api:run-detail", args=[run.id]),
                  "page": reverse("front:run-detail", args=[run.id])},
    }
    if run.model_speedup is not None:
        data["model"] = {"speedup": run.model_speedup, "ci95": [run.model_ci_low, run.model_ci_high],
                         "stable": run.stable}
    if run.result is not None:
        data["links"]["result"] = reverse("front:run-result", args=[run.id])
        data["workloads"] = [
            {"name": w.name, "shape": w.shape, "dtype": w.dtype, "verdict": w.verdict, "speedup": w.speedup,
             "ci95": [w.ci_low, w.ci_high], "reasons": w.reasons, "weight": w.weight}
            for w in run.workload_results.all()]
    if run.artifact is not None:
        data["links"]["artifact"] = reverse("front:run-artifact", args=[run.id])
    if run.inventory is not None:
        data["inventory"] = run.inventory
    if with_events:
        data["events"] = [{"at": e.at.isoformat(), "level": e.level, "stage": e.stage, "message": e.message}
                          for e in run.events.all()]
    return data
