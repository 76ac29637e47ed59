"""`python -m pipeline tune`: the optimizer's search, each candidate graded by the harness's evaluator
(replaced here by a scripted one: the search, the cache and the command line are what is tested;
tests/pipeline/test_optimized_suite.py runs the real evaluator)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.__main__ import main
from tests.optimizer.fake_evaluator import ScriptedSuiteEvaluator


def test_it_tunes_a_suite_workload_and_reuses_the_cache(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setattr("pipeline.evaluator.SandboxEvaluator", ScriptedSuiteEvaluator)
    cache, out = tmp_path / "cache.jsonl", tmp_path / "tune.json"
    args = ["tune", "--workload", "rmsnorm", "--profile", "cpu-ci", "--cache", str(cache), "--json", str(out),
            "--hardware", "test-box"]
    assert main(args) == 0
    first = json.loads(out.read_text())["results"][0]
    assert first["chosen"]["name"].startswith("compile-") and not first["cache_hit"]
    assert first["trials"] and cache.read_text().count("\n") == 1
    assert main(args) == 0
    second = json.loads(out.read_text())["results"][0]
    assert second["cache_hit"] and second["trials"] == []
    assert second["chosen"]["source_sha256"] == first["chosen"]["source_sha256"]
    assert "cache hit" in capsys.readouterr().out


def test_it_explains_an_unknown_workload_or_profile(capsys):
    assert main(["tune", "--workload", "conv2d", "--profile", "cpu-ci"]) == 2
    assert "has no workload 'conv2d'" in capsys.readouterr().err
    assert main(["tune", "--workload", "rmsnorm", "--profile", "tpu"]) == 2
    assert "unknown profile 'tpu'" in capsys.readouterr().err
