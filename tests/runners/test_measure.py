"""Measurement building blocks: pools with secret offsets, commitments, clock checks, rooflines."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from runners import measure, suite
from runners.sandbox import process_cpu_ns


def test_it_plans_pools_with_distinct_aligned_offsets_for_every_call():
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    plan = measure.PoolPlan.for_calls(spec, 300)
    offsets = plan.offsets(np.random.default_rng(0), 300)
    per_input = list(zip(*offsets))
    for index, column in enumerate(per_input):
        assert len(set(column)) == 300  # no two calls share an address
        assert all(o % plan.align[index] == 0 for o in column)
        assert max(column) + plan.numel[index] <= plan.pool_numel(index)
    identical = plan.offsets(np.random.default_rng(0), 5, identical=True)
    assert len({tuple(call) for call in identical}) == 1


def test_it_shifts_grouped_inputs_together_and_keeps_their_rows_whole():
    spec = suite.find_spec("cpu-ci", "rope")[0]
    plan = measure.PoolPlan.for_calls(spec, 20)
    for q, k, cos, sin in plan.offsets(np.random.default_rng(1), 20):
        assert cos == sin and cos % spec.shape["D"] == 0
    pools = measure.make_pools(spec, plan.rows, seed=3, device="cpu")
    _, _, cos, sin = measure.pool_views(suite.input_layouts(spec), pools, plan.offsets(np.random.default_rng(2), 1)[0])
    assert torch.allclose(cos.square() + sin.square(), torch.ones_like(cos), atol=1e-5)


def test_it_regenerates_identical_pools_from_a_seed_and_aligns_views_to_64_bytes():
    spec = suite.find_spec("cpu-ci", "gemm")[0]
    plan = measure.PoolPlan.for_calls(spec, 4)
    first = measure.make_pools(spec, plan.rows, seed=9, device="cpu")
    second = measure.make_pools(spec, plan.rows, seed=9, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    for call in plan.offsets(np.random.default_rng(3), 4):
        for view in measure.pool_views(suite.input_layouts(spec), first, call):
            assert view.data_ptr() % 64 == 0 and view.is_contiguous()


def test_it_commits_to_outputs_so_later_changes_are_caught():
    spec = suite.find_spec("cpu-ci", "softmax")[0]
    weights = measure.commit_weights(spec, 5, device="cpu")
    outputs = [[torch.randn(spec.shape["R"], spec.shape["C"])] for _ in range(3)]
    claimed = measure.checksums(outputs, weights)
    assert all(measure.commitment_holds(c[0], o[0], weights[0]) for c, o in zip(claimed, outputs))
    # Values produced after the window (a placeholder first, the real result at fetch) differ wholesale.
    assert not measure.commitment_holds(claimed[1][0], torch.randn_like(outputs[1][0]), weights[0])
    assert not measure.commitment_holds(claimed[1][0], torch.zeros_like(outputs[1][0]), weights[0])
    assert np.isnan(measure.checksums([[torch.randn(3)]], weights)[0][0])  # wrong size: no commitment


def test_it_rejects_timestamps_outside_the_parents_window():
    assert measure._clock_problem_cpu({"t0": 150, "t1": 180}, 100, 200) == (30, None)
    assert measure._clock_problem_cpu({"t0": 50, "t1": 80}, 100, 200)[1] is not None
    assert measure._clock_problem_cpu({"t0": 150, "t1": 250}, 100, 200)[1] is not None
    assert measure._clock_problem_cpu({}, 100, 200)[1] == "no timestamps"


def test_it_checks_gpu_event_times_against_their_host_intervals():
    ok = {"calls": [[110, 130, 15e-9], [140, 160, 18e-9]]}
    total, events, problem = measure._clock_problem_cuda(ok, 100, 200)
    assert problem is None and total == 40 and events == [15e-9, 18e-9]
    # An event longer than the host interval around it (plus 20 us) is a forged time.
    assert measure._clock_problem_cuda({"calls": [[110, 130, 1e-3]]}, 100, 200)[2] is not None
    assert measure._clock_problem_cuda({"calls": [[140, 160, 1e-9], [110, 130, 1e-9]]}, 100, 200)[2] is not None


def test_it_knows_device_peaks_and_computes_floors():
    h100 = measure.device_peaks("NVIDIA H100 80GB HBM3", threads=1)
    assert h100 is not None and h100["bandwidth"] == 3.35e12
    assert measure.device_peaks("Some Future GPU", threads=1) is None
    spec = suite.find_spec("gpu", "gemm")[0]
    roof = measure.roofline(spec, 1e-3, h100)
    assert roof["floor_s"] == pytest.approx(suite.flops(spec) / 989e12)
    assert roof["tflop_per_s"] == pytest.approx(suite.flops(spec) / 1e-3 / 1e12)
    assert measure.roofline(spec, 1e-3, None)["floor_s"] is None


def test_it_reads_another_process_cpu_time_precisely():
    pid = os.getpid()
    before = process_cpu_ns(pid)
    own = time.thread_time_ns()
    while time.thread_time_ns() - own < 20_000_000:  # 20 ms of this thread's CPU, however loaded the box
        pass
    spent = process_cpu_ns(pid) - before
    assert 0.02e9 <= spent < 0.2e9


def test_it_derives_quick_protocols_without_the_audit_extras():
    quick = measure.quick_protocol("cpu-ci", rounds=3)
    assert quick.rounds == 3 and quick.probe_rounds == 0 and quick.name == "cpu-ci-quick"
    with pytest.raises(ValueError, match="cpu-ci"):
        measure.protocol_for("tpu")
