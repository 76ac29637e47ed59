"""The GPU check's CPU dry run: the script a GPU machine runs for minutes is known to work before one
is at hand (cpu-ci shapes, Triton's interpreter, one workload per phase to keep make test short)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dry_run_passes_every_phase_and_writes_its_figures(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DJANGO_SETTINGS_MODULE")}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(tmp_path),
                           "--workloads", "rmsnorm", "--kernel-tests", "rms"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu-check-dry-run.json").read_text())
    phases = doc["phases"]
    assert doc["dry_run"] is True and list(phases) == ["machine", "kernels", "harness", "optimizer", "cheats", "model", "sandbox"]
    assert all(record["status"] == "ok" for record in phases.values()), {k: v["status"] for k, v in phases.items()}
    assert phases["machine"]["copy_gb_per_s"] > 0 and phases["machine"]["matmul_tflop_per_s"] > 0
    assert phases["kernels"]["tests"]["tests"] >= 2 and phases["kernels"]["tests"]["failures"] == 0
    (aa,) = phases["harness"]["workloads"]
    assert aa["key"].startswith("rmsnorm") and 0 < aa["aa_half_width"] < 1
    (tuned,) = phases["optimizer"]["workloads"]
    assert tuned["verdict"] == "accepted" and tuned["speedup"] > 0 and tuned["over_torch_compile"] > 0
    assert 0 < tuned["share_of_copy_bandwidth"]
    assert [row["as_expected"] for row in phases["cheats"]["cheats"]] == [True]
    # Each audit phase keeps its audits' last progress note: an overrun phase says where it was.
    for name in ("harness", "optimizer", "cheats"):
        assert phases[name]["last_note"]["note"] and phases[name]["last_note"]["at_s"] > 0, phases[name].get("last_note")
    assert "protections" in phases["sandbox"]["sandbox"]
    # The whole-model audit, eager against eager: both phases accepted at about 1x, with an A/A control.
    assert [(p["phase"], p["verdict"]) for p in phases["model"]["phases"]] == [("prefill", "accepted"), ("decode", "accepted")]
    assert all(0.3 < p["speedup"] < 3 and p["aa"]["ci95"] and p["rounds"] == 8 for p in phases["model"]["phases"])
    table = (tmp_path / "gpu-check-dry-run.txt").read_text()
    assert "harness" in table and "rmsnorm" in table


def test_a_phase_that_outruns_its_budget_is_stopped_and_the_next_one_runs(tmp_path, monkeypatch):
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("gpu_check_module", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "HARD_STOP_GRACE_S", 0.2)
    check = module.Check(tmp_path / "check.json", dry_run=True, command="test")

    def stuck(record, deadline):
        record["started"] = True
        time.sleep(30)  # an audit that never returns

    began = time.monotonic()
    stopped = check.phase("harness", 0.2, stuck)
    assert time.monotonic() - began < 5
    assert stopped["status"] == "overran" and stopped["started"] and "budget 0.2 s" in stopped["reason"]
    after = check.phase("model", 5, lambda record, deadline: record.update(ran=True))
    assert after["status"] == "ok" and after["ran"]
    time.sleep(0.6)  # no alarm is left armed for the phase after
    saved = json.loads((tmp_path / "check.json").read_text())["phases"]
    assert saved["harness"]["status"] == "overran" and saved["model"]["status"] == "ok"
