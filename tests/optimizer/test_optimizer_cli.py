"""`python -m optimizer`: optimize-model, and nothing that grades the optimizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer.__main__ import main
from runners.samples import write_sample_model

def test_it_has_no_search_command_of_its_own(capsys):
    # The optimizer never picks its grader: the search runs graded by the harness (python -m pipeline tune).
    with pytest.raises(SystemExit):
        main(["tune", "--workload", "rmsnorm", "--profile", "cpu-ci"])
    assert "invalid choice: 'tune'" in capsys.readouterr().err


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
    unknown = subprocess.run([sys.executable, "-m", "optimizer", "optimize-model", "--model", str(model), "--batch", "1",
                              "--seq", "8", "--out", str(tmp_path / "other.json"), "--variants", "default,turbo"],
                             capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert unknown.returncode == 2 and "'turbo'" in unknown.stderr and "cpp-wrapper-fixed-modules" in unknown.stderr
    assert not (tmp_path / "other.json").exists()
