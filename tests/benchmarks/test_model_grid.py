"""The model grid's verdict per cell (benchmarks/model_grid.py): what docs/model-grid.md claims."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _grid():
    spec = importlib.util.spec_from_file_location("model_grid", ROOT / "benchmarks" / "model_grid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(decode: dict | None) -> dict:
    prefill = {"verdict": "accepted", "speedup": 1.55, "ci95": [1.53, 1.57], "billable": True, "aa_stable": True}
    dyno = {"prefill": prefill} if decode is None else {"prefill": prefill, "decode": decode}
    return {"dyno": dyno, "torch_compile": {"prefill": {"artifact_over_reference_ci95": [1.50, 1.54]}}}


def test_a_cell_meets_its_targets_only_where_no_phase_was_refused():
    grid = _grid()
    assert grid.verdict(_row(None)) == "met"
    assert grid.verdict(_row({"verdict": "accepted", "speedup": 1.3, "ci95": [1.2, 1.4]})) == "met"
    # A refused decode leaves the model without a billed figure, whatever prefill measured.
    refused = grid.verdict(_row({"verdict": "rejected", "speedup": None, "ci95": None}))
    assert refused.startswith("missed") and "decode rejected" in refused
    assert "decode error" in grid.verdict(_row({"verdict": "error", "speedup": None, "ci95": None}))
    unstable = grid.verdict(_row({"verdict": "accepted", "speedup": 1.6, "ci95": [1.4, 1.9], "aa_stable": False}))
    assert unstable.startswith("missed") and "decode A/A unstable" in unstable
    assert grid.verdict(_row({"verdict": "accepted", "speedup": 0.9, "ci95": [0.85, 0.95]})).startswith("slower")
