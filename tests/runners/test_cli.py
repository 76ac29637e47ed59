"""`python -m runners audit|suite`: exit codes, the table, and schema-valid result JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from runners import result
from runners.__main__ import main

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runners", *args, "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def accepted_audit(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "audit.json"
    proc = _run("audit", "--workload", "rmsnorm", "--candidate", str(HERE / "honest" / "rmsnorm_alternative.py"), "--profile", "cpu-ci", "--json", str(out), "--seed", "3")
    return proc, out


def test_it_exits_zero_and_writes_a_valid_result_for_an_accepted_candidate(accepted_audit):
    proc, out = accepted_audit
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    result.validate_document(document)
    assert document["schema"] == "dyno.suite-result/1" and document["kind"] == "audit"
    assert document["verdict"] == "accepted" and document["protocol"]["seed"] == 3
    assert document["candidate"]["source_sha256"] == document["workloads"][0]["candidate"]["source_sha256"]
    assert "verdict: accepted" in proc.stdout and "rmsnorm[R=32,H=256]" in proc.stdout


def test_it_exits_one_and_still_writes_the_json_for_a_rejected_candidate(tmp_path):
    out = tmp_path / "audit.json"
    proc = _run("audit", "--workload", "rmsnorm", "--candidate", str(HERE / "cheats" / "zero_inputs.py"), "--profile", "cpu-ci", "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    document = json.loads(out.read_text())
    result.validate_document(document)
    assert document["verdict"] == "rejected"
    assert document["workloads"][0]["reasons"][0]["code"] == "integrity.input_mutated"


def test_it_runs_a_suite_subset_with_a_candidates_directory(tmp_path):
    candidates = tmp_path / "candidates"
    candidates.mkdir()
    (candidates / "softmax.py").write_text((HERE / "honest" / "softmax_alternative.py").read_text())
    out = tmp_path / "suite.json"
    proc = _run("suite", "--profile", "cpu-ci", "--workloads", "softmax,layernorm", "--candidates", str(candidates), "--json", str(out))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    document = json.loads(out.read_text())
    result.validate_document(document)
    impls = {w["name"]: w["candidate"]["impl"] for w in document["workloads"]}
    assert impls == {"layernorm": "baseline (A/A calibration)", "softmax": "candidate"}
    assert document["summary"]["accepted"] == 2 and "A/A calibration" in proc.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["audit", "--workload", "rms_norm", "--candidate", "x.py", "--profile", "cpu-ci", "--json", "o.json"], "unknown workload"),
        (["audit", "--workload", "rmsnorm", "--candidate", "/nonexistent.py", "--profile", "cpu-ci", "--json", "o.json"], "cannot read"),
        (["suite", "--profile", "tpu", "--json", "o.json"], "unknown profile"),
        (["suite", "--profile", "cpu-ci", "--workloads", "gemm,fft", "--json", "o.json"], "fft"),
        (["audit", "--profile", "cpu-ci"], "required"),
    ],
)
def test_it_exits_two_with_a_clear_message_when_the_audit_cannot_run(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_it_rejects_documents_that_break_the_schema(accepted_audit):
    _, out = accepted_audit
    document = json.loads(out.read_text())
    broken = json.loads(json.dumps(document))
    broken["workloads"][0]["reasons"] = [{"code": "timing.clock_mismatch", "message": "x"}]  # accepted with a reason
    with pytest.raises(jsonschema.ValidationError):
        result.validate_document(broken)
    broken = json.loads(json.dumps(document))
    del broken["suite"]["manifest_sha256"]
    with pytest.raises(jsonschema.ValidationError):
        result.validate_document(broken)


def test_it_keeps_the_package_import_light():
    # Celery and Django import `runners`; torch loads only when an audit actually runs.
    code = "import sys, runners; assert 'torch' not in sys.modules; print(runners.audit_candidate.__name__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "audit_candidate", proc.stderr
