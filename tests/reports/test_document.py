"""The report body (pure): billable statements, canonical stability, comparison, presentation."""

from __future__ import annotations

from decimal import Decimal

import pytest

from reports.compare import compare_bodies
from reports.document import ModelFacts, ModelFile, ReportError, RunFacts, model_figure, report_body
from reports.presentation import report_view, speedup_svg
from proof.canonical import canonical_bytes
from tests.reports.builders import synthetic_result

MODEL = ModelFacts(organization="acme", name="llama-tiny", version=1, version_id="v-1", kind="weights",
                   family="llama", architecture="LlamaForCausalLM", parameter_count=10, dtype="float32",
                   files=(ModelFile(path="config.json", size=5, sha256="c0" * 32),))
RUN = RunFacts(run_id="r-1", hardware="cpu", profile="cpu-ci", batch=1, seq=32,
               finished_at="2026-11-20T12:30:00+00:00", artifact_sha256="af" * 32)


def body_for(result, **kwargs):
    return report_body(kind="run", result=result, model=MODEL, run=RUN, **kwargs)


def test_it_gives_the_same_bytes_for_the_same_run():
    first = canonical_bytes(body_for(synthetic_result()))
    second = canonical_bytes(body_for(synthetic_result()))
    assert first == second
    assert canonical_bytes(body_for(synthetic_result(seed=8))) != first


def test_it_bills_the_ci_lower_bound_rounded_down():
    billing = body_for(synthetic_result(model=(1.31, 1.229999, 1.4)))["billing"]
    assert billing["billable"] is True
    assert billing["model"]["billable_speedup"] == "1.2299"
    assert billing["model"]["speedup"] == "1.3100"
    rows = {w["name"]: w for w in billing["workloads"]}
    assert rows["rmsnorm"]["billable"] and rows["rmsnorm"]["billable_speedup"] == "1.5390"
    assert rows["attention_prefill"] == {**rows["attention_prefill"], "billable": False, "reason": "not_accepted",
                                         "billable_speedup": None}


def test_it_says_an_unstable_run_is_not_billable():
    billing = body_for(synthetic_result(stable=False))["billing"]
    assert billing["billable"] is False
    assert billing["calibration_stable"] is False
    assert [r["code"] for r in billing["reasons"]] == ["unstable_calibration"]
    assert all(not w["billable"] and w["reason"] == "unstable_calibration" for w in billing["workloads"])
    assert model_figure(synthetic_result(stable=False)).ci_low == Decimal("1.2200")


def test_it_does_not_bill_a_bound_at_or_below_one_or_a_missing_model_figure():
    assert body_for(synthetic_result(model=(1.05, 0.99, 1.1)))["billing"]["model"]["reason"] == "no_proven_speedup"
    billing = body_for(synthetic_result(model=None))["billing"]
    assert billing["billable"] is False and billing["reasons"][0]["code"] == "no_model_figure"


def _end_to_end(result, *, stable, phase="prefill", ci=(1.12, 1.35)):
    """The model block a run makes since the end-to-end basis (runners.modelplan.billed_model_block)."""
    amdahl = result["model"]
    result["model"] = {"speedup": 1.2, "ci95": list(ci), "basis": "end_to_end", "billed_phase": phase, "stable": stable,
                       "verdict": "accepted", "amdahl": {"speedup": amdahl["speedup"], "ci95": amdahl["ci95"]},
                       "weighting": amdahl["weighting"]}
    return result


def test_a_model_run_bills_its_end_to_end_figure_on_the_stability_of_its_own_control():
    # The kernel audits' calibration is unstable, the whole-model audit's A/A controls are stable:
    # the end-to-end figure bills; the per-kernel rows keep their own (unstable) calibration.
    billing = body_for(_end_to_end(synthetic_result(stable=False), stable=True))["billing"]
    assert billing["billable"] is True and billing["calibration_stable"] is True
    assert billing["model"]["billable_speedup"] == "1.1200" and billing["model"]["figure"] == "end_to_end (prefill)"
    assert all(w["reason"] == "unstable_calibration" for w in billing["workloads"] if not w["billable"])
    assert "end to end" in billing["rule"]
    # And the other way round: a stable suite does not make an unstable end-to-end figure billable.
    unstable = body_for(_end_to_end(synthetic_result(stable=True), stable=False))["billing"]
    assert unstable["billable"] is False and [r["code"] for r in unstable["reasons"]] == ["unstable_calibration"]
    assert model_figure(_end_to_end(synthetic_result(), stable=False)).stable is False
    # Results made before the basis existed keep billing as they were signed (Amdahl).
    assert body_for(synthetic_result())["billing"]["model"]["figure"].startswith("amdahl")


def test_it_carries_what_a_verifier_needs():
    body = body_for(synthetic_result())
    assert body["schema"] == "dyno.report/1"
    assert body["suite"]["manifest_sha256"] == "ab" * 32
    assert body["model_version"]["files"][0]["sha256"] == "c0" * 32
    assert body["artifact_sha256"] == "af" * 32
    assert body["environment"]["torch"] == "2.13.0"
    assert "eager PyTorch" in body["contract_baseline"]
    assert body["result"]["workloads"][0]["baseline"]["samples_s"]


def test_it_prints_a_model_runs_recipe_as_literal_commands():
    recipe = body_for(synthetic_result())["reproduce"]
    files = {f["name"]: f for f in recipe["files"]}
    assert files["artifact.json"] == {"name": "artifact.json", "url": "/runs/r-1/artifact.json",
                                      "how": "the run page's 'optimization artifact' download", "sha256": "af" * 32}
    assert {"model/", "report.json", "signature.json", "dyno-report-keys.json"} <= set(files)
    assert recipe["commands"] == [
        f"printf '%s  %s\\n' {'af' * 32} artifact.json | sha256sum -c -",
        f"printf '%s  %s\\n' {'c0' * 32} model/config.json | sha256sum -c -",
        "python -m runners model-audit --model model --artifact artifact.json --batch 1 --seq 32 --profile cpu-ci "
        "--device cpu --seed 1234 --json result.json",
        "python -m runners compare-report report.json result.json",
    ]
    assert recipe["verify_signature"] == ("python -m proof verify report.json signature.json "
                                          "--keys dyno-report-keys.json")
    assert "billed model figure" in recipe["note"]


def test_it_prints_a_candidate_audits_recipe_with_the_candidate_download():
    result = {**synthetic_result(verdict="accepted"),
              "candidate": {"label": "mine.py", "workload": "rmsnorm", "source_sha256": "c4" * 32}}
    recipe = report_body(kind="audit", result=result, model=None, run=RUN, organization="acme")["reproduce"]
    assert recipe["files"][0] == {"name": "candidate.py", "url": "/runs/r-1/candidate.py",
                                  "how": "the run page's 'candidate module' download", "sha256": "c4" * 32}
    assert recipe["commands"] == [
        f"printf '%s  %s\\n' {'c4' * 32} candidate.py | sha256sum -c -",
        "python -m runners audit --workload rmsnorm --candidate candidate.py --profile cpu-ci --device cpu "
        "--seed 1234 --json result.json",
        "python -m runners compare-report report.json result.json",
    ]


def test_it_quotes_file_names_and_says_when_no_seed_was_recorded():
    files = (ModelFile(path="my weights.safetensors", size=5, sha256="5e" * 32),)
    model = ModelFacts(**{**MODEL.__dict__, "files": files})
    result = synthetic_result()
    del result["protocol"]["seed"]
    recipe = report_body(kind="run", result=result, model=model, run=RUN)["reproduce"]
    assert f"{'5e' * 32} 'model/my weights.safetensors' | sha256sum -c -" in recipe["commands"][1]
    assert "--seed" not in recipe["commands"][2] and "draws fresh inputs" in recipe["note"]


def test_it_refuses_a_result_that_is_not_a_suite_result():
    with pytest.raises(ReportError, match="dyno.suite-result/1"):
        body_for({"schema": "something/else"})
    broken = synthetic_result()
    del broken["calibration"]
    with pytest.raises(ReportError, match="calibration"):
        body_for(broken)


def test_it_compares_two_reports_workload_by_workload():
    old = body_for(synthetic_result())
    new = body_for(synthetic_result(speedups={"rmsnorm": 1.60, "gemm": 1.30, "attention_prefill": 0.98},
                                    environment={"device": "cpu", "torch": "2.14.0"}))
    comparison = compare_bodies(old, new)
    rows = {d.label.split()[0]: d for d in comparison.workloads}
    assert rows["rmsnorm"].within_old_ci is True
    assert rows["gemm"].within_old_ci is False
    assert rows["gemm"].delta == pytest.approx(0.26)
    assert comparison.all_within_old_ci is False
    assert {c.key for c in comparison.environment} >= {"torch", "cpu"}


def test_a_comparison_names_the_model_figures_basis_and_warns_when_the_two_differ():
    amdahl = body_for(synthetic_result())
    end_to_end = body_for(_end_to_end(synthetic_result(), stable=True))
    again = compare_bodies(end_to_end, body_for(_end_to_end(synthetic_result(), stable=True)))
    assert again.model.label == "whole model, end_to_end (prefill)" and not any("different measurements" in w for w in again.warnings)
    mixed = compare_bodies(amdahl, end_to_end)
    assert mixed.model.label == "whole model"
    assert any("different measurements" in w and "amdahl" in w and "end_to_end (prefill)" in w for w in mixed.warnings)


def test_it_presents_rows_charts_and_a_static_chart():
    view = report_view(body_for(synthetic_result()))
    assert view.summary.billable and view.summary.billable_speedup == "1.2200"
    row = view.rows[0]
    assert row.references[0].name == "torch.compile"
    # Optimized 1.62x over eager and torch.compile is 1.2x over eager: 1.35x over torch.compile.
    assert row.references[0].optimized_vs_reference == pytest.approx(1.62 / 1.2)
    assert {trace["type"] for trace in view.charts["speedup"]["data"]} == {"bar", "scatter"}
    assert len(view.charts["latency"]["data"][0]["y"]) == 3 * 24
    assert "utilization" not in view.charts
    svg = speedup_svg(view.rows)
    assert svg.startswith("<svg") and svg.count("<rect") == 3


def test_it_draws_utilization_only_when_the_runner_measured_it():
    result = synthetic_result(environment={"device": "NVIDIA H200", "peak": {"bandwidth_gbs": 4800.0}})
    result["workloads"][0]["candidate"]["achieved"] = {"bandwidth_gbs": 2400.0}
    figure = report_view(body_for(result)).charts["utilization"]
    assert figure["data"][0]["y"] == [50.0]
