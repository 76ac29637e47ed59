"""`python -m runners model-audit` (the whole-model audit on a customer's box) and `compare-report`
(a reproduction beside the signed report): exit codes, what they write and what they refuse."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from optimizer.model import Strategy, optimize_model
from runners.__main__ import main

SEED = 11
ARTIFACT_SHA = "af" * 32
CANDIDATE_SHA = "c4" * 32


@pytest.fixture(scope="module")
def artifact_file(sample_models, tmp_path_factory) -> Path:
    # The optimizer's real artifact, with its quick timer fixed so that nothing beats the unmodified
    # model: strategy `baseline`, which the optimized worker applies without compiling.
    artifact = optimize_model(sample_models["llama"], batch=1, seq=16, device="cpu", try_compile=False,
                              timer=lambda fn, prepare=None: 1.0)
    assert artifact.strategy == Strategy.BASELINE
    path = tmp_path_factory.mktemp("artifact") / "artifact.json"
    artifact.save(path)
    return path


def _model_audit(model: Path, artifact: Path, out: Path, *extra: str) -> int:
    return main(["model-audit", "--model", str(model), "--artifact", str(artifact), "--batch", "1", "--seq", "16",
                 "--profile", "cpu-ci", "--seed", str(SEED), "--json", str(out), "--quiet", *extra])


def test_it_audits_a_whole_model_against_its_artifact_file(sample_models, artifact_file, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = _model_audit(sample_models["llama"], artifact_file, out)
    document = json.loads(out.read_text())
    assert code == (0 if all(p["verdict"] in ("accepted", "skipped") for p in document["end_to_end"]["phases"]) else 1)
    assert document["artifact_sha256"] == hashlib.sha256(artifact_file.read_bytes()).hexdigest()
    assert document["seed"] == SEED
    block = document["end_to_end"]
    assert block["shape"] == {"batch": 1, "seq": 16} and block["profile"] == "cpu-ci"
    assert block["artifact_strategy"] == Strategy.BASELINE
    assert [p["phase"] for p in block["phases"]] == ["prefill", "decode"]
    assert "prefill:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "is not JSON"),
        (b"[1, 2]", "is not a Dyno optimization artifact"),
        (b'{"schema": "dyno.optimization-artifact/0"}', "is not a Dyno optimization artifact"),
        (b'{"schema": "dyno.optimization-artifact/1"}', "is not a Dyno optimization artifact"),
    ],
)
def test_it_exits_two_for_a_file_that_is_not_an_artifact(sample_models, tmp_path, capsys, content, message):
    artifact = tmp_path / "artifact.json"
    artifact.write_bytes(content)
    assert _model_audit(sample_models["llama"], artifact, tmp_path / "result.json") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "result.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch", "0"], "must be at least 1"),
        (["--profile", "tpu"], "unknown profile"),
    ],
)
def test_it_exits_two_for_arguments_that_cannot_work(sample_models, artifact_file, tmp_path, capsys, argv, message):
    assert _model_audit(sample_models["llama"], artifact_file, tmp_path / "result.json", *argv) == 2
    assert message in capsys.readouterr().err


def test_it_exits_two_for_a_folder_that_is_not_a_model(artifact_file, tmp_path, capsys):
    assert _model_audit(tmp_path, artifact_file, tmp_path / "result.json") == 2
    assert "is not a model folder" in capsys.readouterr().err


# --- compare-report ------------------------------------------------------------------------------


def _workload(speedup: float | None, ci: list[float] | None, verdict: str = "accepted") -> dict:
    return {"name": "rmsnorm", "shape": {"R": 32, "H": 256}, "dtype": "float32", "verdict": verdict,
            "speedup": speedup, "ci95": ci}


def _suite_result(workload: dict, *, seed: int = SEED) -> dict:
    return {"schema": "dyno.suite-result/1", "kind": "audit", "verdict": workload["verdict"],
            "suite": {"version": "1", "profile": "cpu-ci", "manifest_sha256": "ab" * 32},
            "protocol": {"seed": seed}, "calibration": {"stable": True},
            "candidate": {"workload": "rmsnorm", "source_sha256": CANDIDATE_SHA}, "workloads": [workload]}


def _phase(name: str, speedup: float | None, ci: list[float] | None, verdict: str = "accepted") -> dict:
    return {"phase": name, "verdict": verdict, "speedup": speedup, "ci95": ci, "aa": {"stable": True}}


def _end_to_end(*phases: dict) -> dict:
    return {"shape": {"batch": 1, "seq": 16}, "profile": "cpu-ci", "device": "cpu", "phases": list(phases)}


def _report(result: dict, artifact_sha256: str | None = None) -> dict:
    return {"schema": "dyno.report/1", "artifact_sha256": artifact_sha256, "result": result}


def _compare(tmp_path: Path, report: dict, result: dict) -> int:
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "result.json").write_text(json.dumps(result))
    return main(["compare-report", str(tmp_path / "report.json"), str(tmp_path / "result.json")])


AUDIT_REPORT = _report(_suite_result(_workload(1.30, [1.20, 1.40])))


@pytest.mark.parametrize(
    "measured, code, words",
    [
        (_workload(1.25, [1.0, 1.5]), 0, "inside the report's 95% CI"),
        (_workload(1.45, [1.3, 1.6]), 1, "outside the report's 95% CI"),
        (_workload(None, None, "rejected"), 1, "the verdicts differ"),
    ],
)
def test_it_says_whether_each_reproduced_figure_agrees_with_the_report(tmp_path, capsys, measured, code, words):
    assert _compare(tmp_path, AUDIT_REPORT, _suite_result(measured)) == code
    out = capsys.readouterr().out
    assert "rmsnorm R=32,H=256 float32: reproduced" in out and words in out
    assert ("agrees with the report" if code == 0 else "differs from the report") in out


def test_it_notes_another_seed_but_still_compares(tmp_path, capsys):
    assert _compare(tmp_path, AUDIT_REPORT, _suite_result(_workload(1.3, [1.2, 1.4]), seed=99)) == 0
    assert f"seed 99, the report with {SEED}" in capsys.readouterr().out


def test_it_compares_a_model_audit_with_the_reports_end_to_end_phases(tmp_path, capsys):
    signed = {**_suite_result(_workload(1.3, [1.2, 1.4])),
              "model": {"speedup": 1.1, "ci95": [1.05, 1.2],
                        "end_to_end": _end_to_end(_phase("prefill", 1.5, [1.3, 1.7]),
                                                  _phase("decode", None, None, "skipped"))}}
    measured = {"artifact_sha256": ARTIFACT_SHA, "seed": SEED,
                "end_to_end": _end_to_end(_phase("prefill", 1.4, [1.2, 1.6]), _phase("decode", None, None, "skipped"))}
    assert _compare(tmp_path, _report(signed, ARTIFACT_SHA), measured) == 0
    out = capsys.readouterr().out
    assert "model prefill: reproduced accepted 1.400x" in out and "model decode" not in out
    assert "billed model figure" in out


def _cannot(tmp_path, capsys, report: dict, result: dict) -> str:
    assert _compare(tmp_path, report, result) == 2
    return capsys.readouterr().err


def test_it_refuses_files_that_do_not_belong_together(tmp_path, capsys):
    other = copy.deepcopy(_suite_result(_workload(1.3, [1.2, 1.4])))
    other["candidate"]["source_sha256"] = "00" * 32
    assert "download the candidate from the run page again" in _cannot(tmp_path, capsys, AUDIT_REPORT, other)
    other = _suite_result(_workload(1.3, [1.2, 1.4]))
    other["suite"]["profile"] = "cpu"
    assert "use the report's --profile" in _cannot(tmp_path, capsys, AUDIT_REPORT, other)
    prefill = _end_to_end(_phase("prefill", 1.5, [1.3, 1.7]))
    model_report = _report({**AUDIT_REPORT["result"], "model": {"end_to_end": prefill}}, ARTIFACT_SHA)
    reformatted = {"artifact_sha256": "11" * 32, "seed": SEED, "end_to_end": prefill}
    assert "a re-saved or re-formatted file has another hash" in _cannot(tmp_path, capsys, model_report, reformatted)
    assert "not a Dyno report body" in _cannot(tmp_path, capsys, AUDIT_REPORT["result"], AUDIT_REPORT["result"])
    assert "neither what" in _cannot(tmp_path, capsys, AUDIT_REPORT, {"schema": "something/1"})
    assert "no whole-model" in _cannot(tmp_path, capsys, AUDIT_REPORT, reformatted)


def test_it_refuses_a_report_whose_end_to_end_audit_did_not_run(tmp_path, capsys):
    failed = {"end_to_end": {"error": "ModelAuditError: boom"}}
    report = _report({**AUDIT_REPORT["result"], "model": failed}, ARTIFACT_SHA)
    measured = {"artifact_sha256": ARTIFACT_SHA, "seed": SEED, "end_to_end": _end_to_end(_phase("prefill", 1.5, [1.3, 1.7]))}
    assert "did not run (ModelAuditError: boom)" in _cannot(tmp_path, capsys, report, measured)


def test_suite_artifact_refuses_an_artifact_without_kernels_and_a_bad_key(tmp_path, capsys):
    from runners.__main__ import main

    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"schema": "dyno.optimization-artifact/1", "modules": []}))
    assert main(["suite", "--artifact", str(bare), "--profile", "cpu-ci", "--json", str(tmp_path / "r.json")]) == 2
    assert "carries no audited kernels" in capsys.readouterr().err
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"audited": {"rmsnorm[R=32]float32": "def kernel(x, w):\n    return x\n"}}))
    assert main(["suite", "--artifact", str(odd), "--profile", "cpu-ci", "--json", str(tmp_path / "r.json")]) == 2
    assert "shape keys ['R'] are not rmsnorm's" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_compare_report_recomputes_the_billed_model_figure_from_kernel_audits(tmp_path, capsys):
    from runners.__main__ import main

    weighting = [{"key": "rmsnorm[R=32,H=256]float32", "weight": 0.5}, {"key": "gemm[M=8,N=8,K=8]float32", "weight": 0.2}]
    signed = {"schema": "dyno.suite-result/1", "suite": {"profile": "cpu-ci"}, "workloads": [],
              "model": {"speedup": 1.25, "ci95": [1.2, 1.3], "weighting": weighting}}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"schema": "dyno.report/1", "artifact_sha256": "ab" * 32, "result": signed}))

    def measured(rms: float, gemm_verdict: str) -> Path:
        path = tmp_path / f"kernels-{rms}-{gemm_verdict}.json"
        path.write_text(json.dumps({"schema": "dyno.suite-result/1", "suite": {"profile": "cpu-ci"},
                                    "artifact_sha256": "ab" * 32, "workloads": [
            {"key": weighting[0]["key"], "name": "rmsnorm", "verdict": "accepted", "speedup": rms,
             "ci95": [rms - 0.05, rms + 0.05]},
            {"key": weighting[1]["key"], "name": "gemm", "verdict": gemm_verdict, "speedup": 1.5, "ci95": [1.4, 1.6]}]}))
        return path

    # 0.5/1.6 + 0.2/1.5 + 0.3 = 0.7458: 1.341x, outside [1.2, 1.3].
    assert main(["compare-report", str(report), str(measured(1.6, "accepted"))]) == 1
    assert "model figure (billed" in capsys.readouterr().out
    # 0.5/1.5 + 0.2 (gemm rejected: 1x) + 0.3 = 0.8333: 1.2x, inside.
    assert main(["compare-report", str(report), str(measured(1.5, "rejected"))]) == 0
    assert "reproduced weighted 1.200x" in capsys.readouterr().out


def test_calibrate_audits_the_baseline_against_itself_and_says_whether_figures_can_bill(tmp_path, capsys):
    from runners.__main__ import main

    out = tmp_path / "calibration.json"
    code = main(["calibrate", "--profile", "cpu-ci", "--workloads", "rmsnorm", "--quiet", "--json", str(out)])
    document = json.loads(out.read_text())
    (row,) = document["workloads"]
    assert document["schema"] == "dyno.calibration/1" and row["key"].startswith("rmsnorm[")
    lo, hi = row["aa_ci95"]
    assert row["stable"] == (1 - document["aa_tolerance"] <= lo and hi <= 1 + document["aa_tolerance"])
    billable = document["verdict"]["billable"]
    assert code == (0 if billable else 1) and billable == (row["stable"] and row["baseline_verdict"] == "accepted")
    printed = capsys.readouterr().out
    assert ("BILLABLE: " if billable else "NOT BILLABLE: ") in printed and "rmsnorm[" in printed
    assert main(["calibrate", "--profile", "cpu-ci", "--workloads", "conv", "--json", str(out)]) == 2


def test_compare_report_on_the_end_to_end_basis_compares_the_billed_phase_and_the_amdahl_diagnostic(tmp_path, capsys):
    from runners.__main__ import main

    weighting = [{"key": "rmsnorm[R=32,H=256]float32", "weight": 0.5}]
    run = {k: v for k, v in _suite_result(_workload(1.3, [1.2, 1.4])).items() if k != "candidate"}  # a model run's
    signed = {**run,
              "model": {"speedup": 1.5, "ci95": [1.3, 1.7], "basis": "end_to_end", "billed_phase": "prefill",
                        "stable": True, "amdahl": {"speedup": 1.2, "ci95": [1.15, 1.25]}, "weighting": weighting,
                        "end_to_end": _end_to_end(_phase("prefill", 1.5, [1.3, 1.7]),
                                                  _phase("decode", None, None, "skipped"))}}
    measured = {"artifact_sha256": ARTIFACT_SHA, "seed": SEED,
                "end_to_end": _end_to_end(_phase("prefill", 1.4, [1.2, 1.6]), _phase("decode", None, None, "skipped"))}
    assert _compare(tmp_path, _report(signed, ARTIFACT_SHA), measured) == 0
    assert "the billed model figure is the end-to-end prefill phase" in capsys.readouterr().out
    kernels = {"schema": "dyno.suite-result/1", "suite": {"profile": "cpu-ci"}, "artifact_sha256": ARTIFACT_SHA,
               "workloads": [{"key": weighting[0]["key"], "name": "rmsnorm", "verdict": "accepted", "speedup": 1.5,
                              "ci95": [1.45, 1.55]}]}
    # 0.5/1.5 + 0.5 = 0.8333: 1.2x, inside the Amdahl interval [1.15, 1.25] (not the billed [1.3, 1.7]).
    assert _compare(tmp_path, _report(signed, ARTIFACT_SHA), kernels) == 0
    assert "Amdahl model figure (a diagnostic" in capsys.readouterr().out
