"""Fixtures for the reports tests: a signing key per test, succeeded runs carrying synthetic
`dyno.suite-result/1` results (the real run pipeline is built elsewhere), and the people who read them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from tests.reports.builders import FINISHED_AT, PASSWORD, synthetic_result


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Argon2 costs ~0.3 s per user on this machine; these tests are about reports, not passwords."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def signing_key_path(tmp_path, settings):
    """Each test signs with its own development key, created on first use."""
    path = tmp_path / "keys" / "report-signing.pem"
    settings.DYNO_SIGNING_KEY_PATH = str(path)
    return path


@pytest.fixture
def make_run(db):
    """A succeeded run of a model version (rows only, no files on disk) carrying `result`."""
    from catalog.models import Model, ModelFile, ModelVersion
    from runs.models import Run
    from runs.status import Stage, Status

    def make(org, *, result: dict[str, Any] | None = None, name: str = "llama-tiny", version=None,
             hardware: str = "cpu", finished_at: datetime = FINISHED_AT):
        if version is None:
            model, _ = Model.objects.get_or_create(organization=org, name=name)
            version = ModelVersion.objects.create(
                model=model, number=model.versions.count() + 1, kind="weights", family="llama",
                architecture="LlamaForCausalLM", parameter_count=1_234_567, dtype="float32",
                config={"model_type": "llama"}, storage_dir=f"models/{model.pk}", total_bytes=4096)
            ModelFile.objects.create(version=version, path="config.json", size=612, sha256="c0" * 32)
            ModelFile.objects.create(version=version, path="model.safetensors", size=3484, sha256="5e" * 32)
        result = result if result is not None else synthetic_result()
        model_block = result.get("model") or {}
        return Run.objects.create(
            organization=org, model_version=version, hardware=hardware, profile="cpu-ci",
            status=Status.SUCCEEDED, stage=Stage.DONE, progress=1.0, finished_at=finished_at,
            result=result, artifact={"schema": "dyno.optimization-artifact/1", "candidates": {}},
            artifact_sha256="af" * 32, model_speedup=model_block.get("speedup"),
            model_ci_low=(model_block.get("ci95") or [None])[0],
            model_ci_high=(model_block.get("ci95") or [None, None])[1],
            stable=result["calibration"]["stable"])

    return make


@pytest.fixture
def make_report(make_run):
    from reports.services import report_create_for_run

    def make(org, **kwargs):
        return report_create_for_run(run=make_run(org, **kwargs))

    return make


@pytest.fixture
def people(make_org, make_member):
    """acme (owner, member, finance, an assigned auditor), globex (owner, its own auditor), staff."""
    from django.contrib.auth import get_user_model

    acme = make_org("acme", owner="owner@acme.test")
    globex = make_org("globex", owner="owner@globex.test")
    make_member(acme, "member@acme.test", "member")
    make_member(acme, "finance@acme.test", "finance")
    make_member(acme, "auditor@audit.test", "auditor")
    make_member(globex, "auditor@other.test", "auditor")
    staff = get_user_model().objects.create_user("staff@dyno.test", "staff@dyno.test", PASSWORD, is_staff=True)
    return {"acme": acme, "globex": globex, "staff": staff}
