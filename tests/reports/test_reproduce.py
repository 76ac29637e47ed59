"""A signed report's recipe, followed literally: a real run is executed and signed, every file the
recipe names is downloaded through the platform's own views and hashes to what the report signs,
and every command runs as printed, with the real CLI, in a fresh copy of the code."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import reverse

from tests.web.helpers import upload_version

# transaction: the runner's task, in process, reports to a live server's control API on its own connection.
pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
HONEST_RMSNORM = ROOT / "tests" / "runners" / "honest" / "rmsnorm_alternative.py"


@pytest.fixture
def runner_settings(settings, tmp_path, control_api):
    """One audited workload with a short tuning budget, and this test's own locks and tuning cache."""
    settings.VAR_DIR = tmp_path / "var"
    settings.DYNO_RUNNER_CACHE = tmp_path / "var" / "runner-cache"
    settings.DYNO_TUNING_CACHE = tmp_path / "var" / "tuning-cache.jsonl"
    settings.DYNO_RUN_WORKLOAD_LIMIT = 1
    settings.DYNO_TUNE_BUDGET_SECONDS = 2
    # No whole-model compile: the reproduction of a compiled artifact costs two cold compiles, and
    # the compiled path is run by tests/web/test_worker_integration.py and tests/runners/test_modelaudit.py.
    settings.DYNO_OPTIMIZER_WHOLE_MODEL_COMPILE = False
    return settings


@pytest.fixture
def owner(make_org, client):
    from accounts.selectors import actor_for_user
    from django.contrib.auth import get_user_model

    org = make_org(owner="owner@repro.test")
    user = get_user_model().objects.get(email="owner@repro.test")
    client.force_login(user)
    return org, actor_for_user(user)


def _execute_and_sign(run):
    """The run as a runner executes it (the Celery task in process, reporting to the control API of
    a live server), then its signed report."""
    from reports.services import report_create_for_run
    from runs.runner import run_execute

    run_execute.apply(args=[str(run.pk)])
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    return report_create_for_run(run=run)


def _fresh_clone(tmp_path: Path) -> Path:
    """What a clone holds that the recipe runs: the harness, the optimizer whose artifact it applies, the verifier."""
    clone = tmp_path / "clone"
    for package in ("runners", "optimizer", "proof"):
        shutil.copytree(ROOT / package, clone / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return clone


def _bytes(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def _download(client, report, clone: Path, *, model_folder: Path | None = None) -> dict:
    """Every file of the recipe under its name in the clone, from where the recipe says it comes."""
    recipe = json.loads(report.body_bytes)["reproduce"]
    buttons = {"report.json": reverse("reports:download-json", args=[report.pk]),
               "signature.json": reverse("reports:download-signature", args=[report.pk])}
    for entry in recipe["files"]:
        if entry["name"] == "model/":
            assert model_folder is not None, "a model recipe needs the customer's model folder"
            shutil.copytree(model_folder, clone / "model")
            continue
        response = client.get(entry["url"] or buttons[entry["name"]])
        assert response.status_code == 200, (entry, response.status_code)
        data = _bytes(response)
        if entry["sha256"]:
            assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["name"]
            assert f'filename="{entry["name"]}"' in response["Content-Disposition"]
        (clone / entry["name"]).write_bytes(data)
    return recipe


def _follow(lines: list[str], clone: Path) -> list[subprocess.CompletedProcess[str]]:
    """Each line exactly as printed, from the clone's root; `python` is this environment's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = []
    for line in lines:
        proc = subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
        done.append(proc)
        assert proc.returncode in (0, 1), f"{line}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return done


def _check_recipe_end_to_end(client, report, clone: Path, **download) -> tuple[dict, dict, str, dict[str, str]]:
    recipe = _download(client, report, clone, **download)
    done = _follow([*recipe["commands"], recipe["verify_signature"]], clone)
    for line, proc in zip(recipe["commands"], done):
        if "sha256sum -c" in line:
            assert proc.returncode == 0 and ": OK" in proc.stdout, proc.stdout + proc.stderr
    assert done[-1].returncode == 0, done[-1].stdout + done[-1].stderr  # the signature verifies offline
    compared = done[-2]
    assert "python -m runners compare-report report.json result.json" == recipe["commands"][-1]
    assert "the reproduction agrees with the report" in compared.stdout or \
        "the reproduction differs from the report" in compared.stdout, compared.stdout + compared.stderr
    body = json.loads(report.body_bytes)
    printed = {line: proc.stdout for line, proc in zip(recipe["commands"], done)}
    return body, json.loads((clone / "result.json").read_text()), compared.stdout, printed


def test_it_reproduces_the_audit_of_a_submitted_candidate_as_printed(
        owner, client, runner_settings, tmp_path, django_capture_on_commit_callbacks):
    from runs.services import audit_start

    org, actor = owner
    with django_capture_on_commit_callbacks(execute=False):
        run = audit_start(actor=actor, organization_id=org.pk, workload="rmsnorm",
                          source=HONEST_RMSNORM.read_text(), hardware="cpu", profile="cpu-ci")
    report = _execute_and_sign(run)
    clone = _fresh_clone(tmp_path)

    body, reproduced, compared, _ = _check_recipe_end_to_end(client, report, clone)

    assert (clone / "candidate.py").read_bytes() == HONEST_RMSNORM.read_bytes()
    assert reproduced["candidate"]["source_sha256"] == body["result"]["candidate"]["source_sha256"]
    assert reproduced["protocol"]["seed"] == body["result"]["protocol"]["seed"]
    ours, theirs = reproduced["workloads"][0], body["result"]["workloads"][0]
    assert ours["name"] == theirs["name"] == "rmsnorm" and ours["shape"] == theirs["shape"]
    assert theirs["verdict"] == "accepted" and len(theirs["ci95"]) == 2  # an honest candidate
    assert ours["verdict"] != "accepted" or isinstance(ours["speedup"], float)
    assert "rmsnorm" in compared and "report accepted" in compared


# A real model run (profile, tune, audit, whole-model audit), then its model-audit: 103 s on the 2-core VM.
@pytest.mark.slow
def test_it_reproduces_a_model_run_from_its_artifact_as_printed(
        owner, client, runner_settings, tmp_path, sample_models, media_root, django_capture_on_commit_callbacks):
    from runs.services import run_start

    org, actor = owner
    version = upload_version(org=org, folder=sample_models["llama"], actor=actor)
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(actor=actor, version=version, hardware="cpu", profile="cpu-ci", batch=1, seq=32)
    report = _execute_and_sign(run)
    clone = _fresh_clone(tmp_path)

    body, reproduced, compared, printed = _check_recipe_end_to_end(client, report, clone,
                                                                   model_folder=sample_models["llama"])

    assert hashlib.sha256((clone / "artifact.json").read_bytes()).hexdigest() == body["artifact_sha256"]
    assert reproduced["artifact_sha256"] == body["artifact_sha256"]
    assert reproduced["seed"] == body["result"]["protocol"]["seed"]
    theirs = {p["phase"]: p for p in body["result"]["model"]["end_to_end"]["phases"]}
    for phase in reproduced["end_to_end"]["phases"]:
        assert phase["phase"] in theirs and f"model {phase['phase']}:" in compared
        if phase["verdict"] == "accepted":
            assert isinstance(phase["speedup"], float)
    assert any(p["ci95"] for p in theirs.values()), theirs
    # The billed figure is the end-to-end audit's (compared above, phase by phase); the Amdahl
    # diagnostic beside it: the artifact's kernels audited again, weighted with the report's shares.
    model = body["result"]["model"]
    assert model["basis"] == "end_to_end"
    if model.get("billed_phase"):
        assert f"the billed model figure is the end-to-end {model['billed_phase']} phase" in compared
    (kernels_line,) = [line for line in printed if " suite --artifact artifact.json " in line]
    kernels = json.loads((clone / "kernels.json").read_text())
    assert {w["key"] for w in kernels["workloads"]} == {w["key"] for w in model["weighting"]}
    (diagnostic,) = [out for line, out in printed.items() if line.endswith("compare-report report.json kernels.json")]
    assert "Amdahl model figure (a diagnostic" in diagnostic
    assert f"report weighted {model['amdahl']['speedup']:.3f}x" in diagnostic
