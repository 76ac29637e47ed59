"""`python -m optimizer`: tune through an evaluator loaded by dotted path, and optimize-model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from optimizer.__main__ import main
from runners.samples import write_sample_model

FAKE = "tests.optimizer.fake_evaluator:ScriptedSuiteEvaluator"


def test_it_tunes_a_suite_workload_and_reuses_the_cache(tmp_path: Path, capsys):
    cache, out = tmp_path / "cache.jsonl", tmp_path / "tune.json"
    args = ["tune", "--workload", "rmsnorm", "--profile", "cpu-ci", "--evaluator", FAKE, "--cache", str(cache),
            "--json", str(out), "--hardware", "test-box"]
    assert main(args) == 0
    first = json.loads(out.read_text())["results"][0]
    assert first["chosen"]["name"].startswith("compile-") and not first["cache_hit"]
    assert first["trials"] and cache.read_text().count("\n") == 1
    assert main(args) == 0
    second = json.loads(out.read_text())["results"][0]
    assert second["cache_hit"] and second["trials"] == []
    assert second["chosen"]["source_sha256"] == first["chosen"]["source_sha256"]
    assert "cache hit" in capsys.readouterr().out


def test_it_explains_an_unknown_workload_or_evaluator(capsys):
    assert main(["tune", "--workload", "conv2d", "--profile", "cpu-ci", "--evaluator", FAKE]) == 2
    assert "has no workload 'conv2d'" in capsys.readouterr().err
    assert main(["tune", "--workload", "rmsnorm", "--profile", "cpu-ci", "--evaluator", "no.such.module:Evaluator"]) == 2
    assert "cannot import 'no.such.module'" in capsys.readouterr().err


def test_it_writes_a_model_artifact_from_the_command_line(tmp_path: Path):
    model = write_sample_model(tmp_path / "llama", "llama")
    out = tmp_path / "artifact.json"
    proc = subprocess.run(
        [sys.executable, "-m", "optimizer", "optimize-model", "--model", str(model), "--batch", "1", "--seq", "8",
         "--out", str(out), "--no-compile"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["schema"] == "dyno.optimization-artifact/1"
    assert {m["family"] for m in data["modules"] if m["status"] != "fallback"} == {"rmsnorm", "swiglu"}
    assert "LlamaForCausalLM: strategy" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "optimizer", "optimize-model", "--model", str(tmp_path), "--batch", "1",
                          "--seq", "8", "--out", str(out)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert bad.returncode == 2 and "has no config.json" in bad.stderr
