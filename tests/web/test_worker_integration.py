"""A real Celery worker process on Redis and PostgreSQL runs profiling runs, and dies gracefully."""

import pytest

from accounts.selectors import Actor
from fleet.models import Runner
from runs.models import Run
from runs.services import run_start, runs_reap_stale

from ..conftest import wait_for
from .helpers import upload_version

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def version(make_org, sample_models, media_root):
    org = make_org()
    return upload_version(org=org, folder=sample_models["llama"]), Actor(roles={org.pk: "owner"})


def test_it_runs_a_model_through_every_stage(start_worker, version, tmp_path, settings):
    """On a runner that holds no database credentials (as in production: DYNO_ROLE=runner, the broker
    and a runner key), beside a control worker that signs the report."""
    from reports.models import Report

    version, actor = version
    settings.DYNO_SIGNING_KEY_PATH = str(tmp_path / "keys" / "signing.pem")
    start_worker("control", DYNO_SIGNING_KEY_PATH=settings.DYNO_SIGNING_KEY_PATH)
    worker = start_worker("cpu", runner_only=True)
    environ = dict(item.split("=", 1) for item in
                   open(f"/proc/{worker.proc.pid}/environ", "rb").read().decode().split("\0") if "=" in item)
    assert "DATABASE_URL" not in environ and environ["DYNO_ROLE"] == "runner"
    runner = Runner.objects.get(hostname=worker.name)
    assert runner.hardware == "cpu" and runner.fingerprint.get("torch")
    run = run_start(actor=actor, version=version, hardware="cpu", batch=2, seq=16)
    # Up to ~2 min more when the optimizer picks a whole-model compile (the end-to-end audit then
    # compiles the model cold, on one core, for prefill and for decode); test runners search one
    # compile variant (DYNO_OPTIMIZER_COMPILE_VARIANTS); with all eight this took 231 s in all on a
    # clean-clone CI run of 2026-12-03.
    wait_for(lambda: Run.objects.get(pk=run.pk).finished, timeout=480, what="the run to finish")
    run.refresh_from_db()
    assert run.status == "succeeded", (run.error, worker.log.read_text()[-3000:])
    assert run.worker == worker.name and run.progress == 1.0
    families = {w["family"] for w in run.inventory["workloads"]}
    assert {"gemm", "rmsnorm", "attention_prefill"} <= families
    assert run.inventory["eager_latency_s"]["median"] > 0
    stages = list(run.events.exclude(stage="").values_list("stage", flat=True).distinct())
    assert [s for s in ("profile", "optimize", "audit", "store", "done") if s in stages] == \
        ["profile", "optimize", "audit", "store", "done"]
    # Results: one row per audited workload plus the model, the raw result, the artifact.
    rows = list(run.workload_results.all())
    assert sum(r.is_model for r in rows) == 1 and len(rows) == 3  # DYNO_RUN_WORKLOAD_LIMIT=2 in tests
    assert run.result["schema"] == "dyno.suite-result/1"
    # The calibration the platform holds for the runner (the suite's stand-in, tests/conftest.py), not the runner's word.
    assert run.result["environment"]["runner_calibration"]["billable"] is True
    # The billed figure is the end-to-end audit's (the Amdahl figure of the kernel audits beside it).
    model = run.result["model"]
    assert model["basis"] == "end_to_end" and model["amdahl"]["ci95"][0] <= model["amdahl"]["speedup"]
    if model["verdict"] == "accepted":
        assert run.model_ci_low <= run.model_speedup <= run.model_ci_high and model["billed_phase"] in ("prefill", "decode")
        # Whether it bills is said check by check.
        codes = [n["code"] for n in model["not_billable"]]
        assert ("model.aa_unstable" in codes) == (not model["stable"])
        assert ("model.no_proven_speedup" in codes) == (model["ci95"][0] <= 1.0)
    else:
        assert run.model_speedup is None and model["reasons"]
    assert run.artifact["schema"] == "dyno.optimization-artifact/1" and len(run.artifact_sha256) == 64
    assert {r.verdict for r in rows} <= {"accepted", "rejected", "error"}
    # The whole forward pass was audited too: prefill and (a Llama has a KV cache) decode.
    end_to_end = run.result["model"]["end_to_end"]
    assert "error" not in end_to_end, end_to_end
    assert [p["phase"] for p in end_to_end["phases"]] == ["prefill", "decode"]
    assert all(p["verdict"] in ("accepted", "rejected", "error") for p in end_to_end["phases"])
    # The control worker, which alone holds the signing key, signs what the runner handed back.
    wait_for(lambda: Report.objects.filter(run=run).exists(), timeout=60, interval=0.5, what="the signed report")


def test_it_never_leaves_a_killed_workers_run_running(start_worker, version):
    version, actor = version
    worker = start_worker()
    # A long enough run that the kill lands mid-profile.
    run = run_start(actor=actor, version=version, hardware="cpu", batch=16, seq=1024)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "running", timeout=60, what="the run to start")
    worker.kill()
    assert Run.objects.get(pk=run.pk).status == "running"
    # The reaper (celery beat in production) fails it once heartbeats are stale.
    wait_for(lambda: runs_reap_stale(stale_seconds=3), timeout=30, what="the reaper to act")
    run.refresh_from_db()
    assert run.status == "failed" and "heartbeats" in run.error


def test_it_fails_the_run_a_restarted_worker_held(start_worker, version):
    version, actor = version
    worker = start_worker()
    run = run_start(actor=actor, version=version, hardware="cpu", batch=16, seq=1024)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "running", timeout=60, what="the run to start")
    worker.kill()
    # The same worker coming back holds nothing: what it was running is failed as it registers.
    start_worker(name=worker.name)
    run.refresh_from_db()
    assert run.status == "failed" and "restarted" in run.error


def test_it_stops_a_cancelled_run_within_seconds_and_serves_the_next(start_worker, version):
    from runs.models import RunEvent
    from runs.services import audit_start, run_cancel

    version, actor = version
    worker = start_worker()
    run = run_start(actor=actor, version=version, hardware="cpu", batch=2, seq=16)
    wait_for(lambda: RunEvent.objects.filter(run=run, stage="optimize").exists(), timeout=120, interval=0.2,
             what="the run to be optimizing")
    assert run_cancel(actor=actor, run=Run.objects.get(pk=run.pk)) is True
    # The worker notices at its next progress report (every tuning trial, every audit round).
    wait_for(lambda: run.events.filter(message="stopped: the run was cancelled").exists(), timeout=30, interval=0.2,
             what="the worker to stop the cancelled run")
    run.refresh_from_db()
    assert run.status == "cancelled" and not run.workload_results.exists() and run.result is None
    following = audit_start(actor=actor, organization_id=version.organization_id, workload="rmsnorm", hardware="cpu",
                            source="import torch.nn.functional as F\n\ndef kernel(x, w):\n"
                                   "    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)\n")
    wait_for(lambda: Run.objects.get(pk=following.pk).finished, timeout=120, what="the next job")
    following.refresh_from_db()
    assert following.status == "succeeded" and following.worker == worker.name, following.error
