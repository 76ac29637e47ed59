"""A failed run tells the customer what went wrong in the exception's words, without the server's
paths or addresses."""

from __future__ import annotations

import pytest

from runs.models import Run
from runs.status import Stage, Status

from .test_reaudit import people  # noqa: F401  (fixture)


@pytest.mark.django_db(transaction=True)
def test_a_failed_runs_error_names_no_server_path(people, monkeypatch, control_api):  # noqa: F811
    import pipeline.model_run
    from runs.runner import run_execute

    from catalog.models import Model, ModelVersion

    model = Model.objects.create(organization=people, name="tiny")
    version = ModelVersion.objects.create(model=model, number=1, kind="weights", family="llama",
                                          architecture="LlamaForCausalLM", parameter_count=1000, dtype="float32",
                                          config={}, storage_dir="models/x", total_bytes=1)
    run = Run.objects.create(organization=people, model_version=version, hardware="cpu", profile="cpu-ci", batch=1,
                             seq=8, status=Status.QUEUED, stage=Stage.WAITING)

    def broken(model_dir, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", f"{model_dir}/tokenizer/merges.txt via 10.1.2.3:6379")

    monkeypatch.setattr(pipeline.model_run, "run_model_pipeline", broken)
    run_execute.apply(args=[str(run.pk)])  # the runner's task in this process, reporting to the control API
    run.refresh_from_db()
    assert run.status == Status.FAILED, run.error
    assert run.error.startswith("FileNotFoundError: ") and ".../merges.txt" in run.error
    assert "/" not in run.error.replace(".../", "") and "10.1.2.3" not in run.error and "<address>" in run.error
