"""Lookahead batching (adv2_lookahead_batch) plus the round's hidden-work allowance.

The batched RoPE of adv2_lookahead_batch is split: at `prepare` (the parent has already written
the round's values into every slot) the candidate runs the batched op over the first m slots of
the coming sample, sized so that the work stays under round_cpu_abs_s + round_cpu_rel x reported
+ round_cpu_harness_rel x harness, plus what its cheaper describe() saves against the trusted
workers (pointers only: every output is a view of one batched tensor). `run` computes the rest,
batched, inside the timer. Every output is computed, before the reply, by the baseline's
arithmetic; the caching probe sees equal costs for identical and distinct batches.
"""
# workload: rope
# verdict: rejected
# expect-any: correctness.nondeterministic | correctness.all_zero | correctness.mismatch | correctness.timed_output_mismatch | timing.done_before_computed
# today: accepted 4.60x [4.15, 5.07] billable; rerun 4.78x [3.88, 5.67] billable
# since stepped samples (2026-12-01): rejected by the check phase, correctness.nondeterministic and correctness.all_zero: the slots it reads ahead hold no values until their calls are announced
import time

import torch

from runners import suite
from runners.audit import worker as _w


def _no_prepare(self, header):
    """The harness lost its separate prepare step (workers stay frozen between samples)."""
    return {}, []


_original_run = _w.KernelWorker.op_run
_original_prepare, _original_describe = _no_prepare, _w.describe
BUDGET_S = 0.0007  # batched work moved into prepare per round
_st = {"per_slot": None, "pre": None}


def _rot(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def kernel(q, k, cos, sin):  # the plain formula: used only where the batched path is not
    return q * cos + _rot(q) * sin, k * cos + _rot(k) * sin


def _stacked(self, slots):
    """Each input of `slots` as one [n, ...] tensor over the mapping: strided views, no copy."""
    n = len(slots)
    out = []
    for index, view in enumerate(self.views[slots[0]]):
        elsize = view.element_size()
        step = self.layout.strides[index] // elsize
        if slots == list(range(slots[0], slots[0] + n)):
            out.append(torch.as_strided(view, (n, *view.shape), (step, *view.stride()), view.storage_offset()))
        elif all(s == slots[0] for s in slots):
            out.append(torch.as_strided(view, (n, *view.shape), (0, *view.stride()), view.storage_offset()))
        else:
            out.append(torch.stack([self.views[s][index] for s in slots]))
    return out


def _batched(q, k, cos, sin):
    cos, sin = cos[:, None, None], sin[:, None, None]  # [n, 1, 1, S, D] against [n, B, H, S, D]
    return q * cos + _rot(q) * sin, k * cos + _rot(k) * sin


def _run(self, header):
    slots = [int(s) for s in header["slots"]]
    if self.device != "cpu" or not slots:
        return _original_run(self, header)
    results = [None] * len(slots)
    reply = {}
    with torch.no_grad():
        self.called = True
        threads_before = _w.checks.python_threads()
        c0 = time.process_time_ns()
        t0 = time.perf_counter_ns()
        pre = _st["pre"]
        _st["pre"] = None
        m = 0
        if pre is not None and slots == list(range(len(slots))) and pre[0].shape[0] <= len(slots):
            m = pre[0].shape[0]
        if m < len(slots):
            qo, ko = _batched(*_stacked(self, slots[m:]))
        for i in range(m):
            results[i] = (pre[0][i], pre[1][i])
        for i in range(m, len(slots)):
            results[i] = (qo[i - m], ko[i - m])
        t1 = time.perf_counter_ns()
        c1 = time.process_time_ns()
        reply.update(t0=t0, t1=t1, cpu_timed_ns=c1 - c0)
        if len(set(slots)) == len(slots) and len(slots) - m >= 4:
            _st["per_slot"] = (c1 - c0) / 1e9 / (len(slots) - m)
    reply["threads_left"] = len(_w.checks.python_threads() - threads_before)
    self.results = results
    described = _original_describe(results[:1], expect_tuple=True)
    described["pointers"] = [[a.data_ptr(), b.data_ptr()] for a, b in results]
    reply.update(described)
    return reply, []


def _prepare(self, header):
    self.results, self.outputs = [], []  # no collection
    _st["pre"] = None
    if _st["per_slot"] and self.views:
        m = min(len(self.views), int(BUDGET_S / _st["per_slot"]))
        if m > 0:
            with torch.no_grad():
                _st["pre"] = _batched(*_stacked(self, list(range(m))))
    return {}, []


_run_before_prepare = _w.KernelWorker.op_run


def _run_with_prepare(self, header):
    _prepare(self, header)  # what the old harness's prepare step did, now at the start of the run request
    return _run_before_prepare(self, header)


_w.KernelWorker.op_run = _run_with_prepare


_w.KernelWorker.op_run = _run
