"""`python -m pipeline suite`: the optimizer tunes (tuning cache first), the harness audits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import model_run, optimized
from runners import result
from runners.fingerprint import environment_fingerprint

ROOT = Path(__file__).resolve().parents[2]
# layernorm's CPU search starts with eager variants, so a 1 s budget ends before any torch.compile build.
WORKLOAD, KEY = "layernorm", "layernorm[R=32,H=256]float32"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # tests/optimizer's conftest turns the Triton interpreter on for the whole session; these runs time real kernels.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "pipeline", *args, "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _optimized(cache: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _run("suite", "--profile", "cpu-ci", "--workloads", WORKLOAD, "--tuning-cache", str(cache),
                "--tune-budget", "1", "--json", str(out), *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A cold run on an empty cache (with the default reference point), then a warm one on the same cache."""
    work = tmp_path_factory.mktemp("optimized")
    cache = work / "tuning.jsonl"
    cold = _optimized(cache, work / "cold.json")
    warm = _optimized(cache, work / "warm.json", "--reference-points", "")
    return cache, (cold, work / "cold.json"), (warm, work / "warm.json")


def test_it_tunes_then_audits_what_the_optimizer_chose(runs):
    cache, (proc, out), _ = runs
    assert proc.returncode == 0, proc.stderr + proc.stdout
    document = json.loads(out.read_text())
    result.validate_document(document)
    assert document["kind"] == "suite" and [w["key"] for w in document["workloads"]] == [KEY]
    workload = document["workloads"][0]
    assert workload["verdict"] == "accepted" and workload["speedup"] > 0
    # An optimized run is judged beside what torch.compile gives for free unless told otherwise.
    assert workload["reference_points"]["torch-compile"]["median_s"] > 0
    (record,) = document["optimization"]["tuning"]
    assert record["key"] == KEY and record["cache_hit"] is False and record["trials"] >= 1
    # The audited module is the one the optimizer chose, byte for byte.
    assert record["source_sha256"] == workload["candidate"]["source_sha256"]
    assert document["optimization"]["seconds"]["tune"] > 0 and document["optimization"]["budget_s"] == 1.0
    assert len(cache.read_text().splitlines()) == 1
    assert KEY.replace("float32", " float32") in proc.stdout  # the audit's table
    assert f"  {KEY}: {record['candidate']} ({record['trials']} trials" in proc.stdout  # and what was tuned


def test_it_answers_a_second_run_from_the_tuning_cache(runs):
    cache, (_, cold_out), (proc, out) = runs
    assert proc.returncode == 0, proc.stderr + proc.stdout
    document = json.loads(out.read_text())
    result.validate_document(document)
    (record,) = document["optimization"]["tuning"]
    (cold_record,) = json.loads(cold_out.read_text())["optimization"]["tuning"]
    assert record["cache_hit"] is True and record["trials"] == 0 and record["strategy"] == "cache"
    assert record["source_sha256"] == cold_record["source_sha256"] == document["workloads"][0]["candidate"]["source_sha256"]
    assert document["optimization"]["seconds"]["tune"] < 5.0
    assert document["workloads"][0]["verdict"] == "accepted" and document["workloads"][0]["reference_points"] == {}
    assert len(cache.read_text().splitlines()) == 1  # a hit writes nothing
    assert f"  {KEY}: {record['candidate']} (cache hit)" in proc.stdout


def test_the_judges_command_line_has_no_optimizer_in_it(tmp_path):
    """The harness's CLI audits what it is given; tuning is the pipeline's (runners never imports the optimizer)."""
    out = tmp_path / "suite.json"
    proc = subprocess.run([sys.executable, "-m", "runners", "suite", "--profile", "cpu-ci", "--optimized", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unrecognized arguments: --optimized" in proc.stderr and not out.exists()


def test_it_refuses_a_budget_that_is_not_positive(tmp_path):
    out = tmp_path / "suite.json"
    proc = _run("suite", "--profile", "cpu-ci", "--tune-budget", "0", "--json", str(out))
    assert proc.returncode == 2 and "positive number of seconds" in proc.stderr and not out.exists()
    proc = _run("suite", "--profile", "cpu-ci", "--workloads", "conv", "--json", str(out))
    assert proc.returncode == 2 and "unknown workload(s) conv" in proc.stderr and not out.exists()


def test_it_refuses_a_tuning_cache_it_cannot_write_before_tuning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = _run("suite", "--profile", "cpu-ci", "--tuning-cache", str(blocker / "cache.jsonl"),
                "--json", str(tmp_path / "suite.json"))
    assert proc.returncode == 2 and f"cannot use tuning cache {blocker / 'cache.jsonl'}" in proc.stderr


def test_it_keys_the_tuning_cache_like_the_model_pipeline(monkeypatch, tmp_path):
    """Suite runs and model runs on one runner share their tuning decisions: the pipeline tunes under
    the label a suite run computes, which stays put between runs on one machine."""
    import runners.inventory

    class Tuned(Exception):
        pass

    def tune_specs(specs, *, hardware, **kwargs):
        raise Tuned(hardware)

    monkeypatch.setattr(runners.inventory, "take_inventory", lambda *args, **kwargs: {"workloads": []})
    monkeypatch.setattr(optimized, "tune_specs", tune_specs)
    with pytest.raises(Tuned) as tuned:
        model_run.run_model_pipeline(tmp_path, batch=1, seq=8, profile="cpu-ci", device="cpu",
                                    tuning_cache=tmp_path / "tuning.jsonl", progress=lambda *args: None)
    fingerprint = environment_fingerprint("cpu")
    assert tuned.value.args[0] == optimized.hardware_label(fingerprint)
    later = {**fingerprint, "hostname": "elsewhere", "load_average": [9.0, 9.0, 9.0]}
    assert optimized.hardware_label(later) == optimized.hardware_label(fingerprint)
    assert optimized.hardware_label({**fingerprint, "threads": 999}) != optimized.hardware_label(fingerprint)


def test_it_selects_the_profile_specs_in_profile_order_and_names_unknown_workloads():
    assert [s.name for s in optimized.selected_specs("cpu-ci", ["softmax", "rmsnorm"])] == ["rmsnorm", "softmax"]
    assert len(optimized.selected_specs("gpu")) > len({s.name for s in optimized.selected_specs("gpu")})
    with pytest.raises(ValueError, match="unknown workload 'conv'"):
        optimized.selected_specs("cpu-ci", ["conv"])


def test_the_environment_names_the_kernels_huge_page_mode():
    from pathlib import Path

    mode = environment_fingerprint("cpu")["transparent_hugepage"]
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if path.exists():
        assert f"[{mode}]" in path.read_text()
    else:
        assert mode is None


def test_the_environment_names_what_the_kernel_reclaims_behind_a_workers_back():
    from pathlib import Path

    reclaim = environment_fingerprint("cpu")["memory_reclaim"]
    assert set(reclaim) == {"damon_actions", "free_page_reporting"} and isinstance(reclaim["free_page_reporting"], bool)
    running = [state for state in Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/state") if state.read_text().strip() == "on"]
    actions = [action for state in running for action in state.parent.glob("contexts/*/schemes/*/action")]
    assert len(reclaim["damon_actions"]) == len(actions)
    assert all(action in {"willcold", "willhot", "pageout", "hugepage", "nohugepage", "lru_prio", "lru_deprio",
                          "migrate_hot", "migrate_cold", "stat"} for action in reclaim["damon_actions"]), reclaim

