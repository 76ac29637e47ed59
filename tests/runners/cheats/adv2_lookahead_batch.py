"""Lookahead across the calls of a sample: every slot a sample will read is in the shared mapping
before the sample starts, at a fixed stride, so one batched op computes every call's outputs.

The candidate replaces KernelWorker.op_run (same process; the parent only checks what it can see
from outside). Inside the timer it views the sample's slots of each input as ONE strided tensor
over the mapping (no copy: slot s of input i is at offsets[i] + s * strides[i]; a repeated slot,
the caching probe's identical batch, is a zero stride), runs RoPE once over all of them, and
returns per-call views of the batched outputs. Every output of every call is computed, inside
the timer, with the same arithmetic as the baseline; what disappears is the per-call dispatch of
the baseline's ~10 eager ops, which dominates at cpu-ci sizes. The calls are independent and the
parent hands all of them over at once, which a real caller of one RoPE at a time never does.
Nothing the parent checks differs: every output is an exact torch.Tensor of call 0's layout,
outside the inputs, computed before the reply, deterministic; identical and distinct probe
batches cost the same.
"""
# workload: rope
# verdict: rejected
# expect-any: correctness.nondeterministic | correctness.all_zero | correctness.mismatch | correctness.timed_output_mismatch | timing.done_before_computed
# today: accepted 2.48x [2.19, 3.33] billable; reruns 3.40x [2.71, 4.24], 3.53x [3.06, 4.30] (A/A unstable, not billable)
# since stepped samples (2026-12-01): rejected by the check phase, correctness.nondeterministic and correctness.all_zero: the slots it reads ahead hold no values until their calls are announced
import time

import torch

from runners import suite
from runners.audit import worker as _w

_original_run = _w.KernelWorker.op_run


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
        qo, ko = _batched(*_stacked(self, slots))
        for i in range(len(slots)):
            results[i] = (qo[i], ko[i])
        t1 = time.perf_counter_ns()
        c1 = time.process_time_ns()
        reply.update(t0=t0, t1=t1, cpu_timed_ns=c1 - c0)
    reply["threads_left"] = len(_w.checks.python_threads() - threads_before)
    self.results = results
    reply.update(_w.describe(results, expect_tuple=suite.returns_tuple(self.spec)))
    return reply, []


_w.KernelWorker.op_run = _run
