"""Class 4 (CPU allowances granted per phase), against the new harness.

The new harness grants one allowance per round for the sum of everything outside the timer:
round_cpu_abs_s + round_cpu_rel x reported + round_cpu_harness_rel x harness. The old split
(part of the owed work in one phase, part in another, each under its own allowance) now adds up
against that single figure: `prepare` computes the first calls of the coming sample (~0.5 ms of
F.rms_norm), and inside `run` the last calls return empty tensors at once and are filled after
the timer stops, before the reply (another ~0.5 ms). All outputs are correct before the reply.
adv2_hidden_budget.py is the same idea kept under the single allowance (accepted).
"""
# workload: rmsnorm
# verdict: rejected
# expect-any: integrity.background_cpu | timing.clock_mismatch
# unsettled: sizes its hidden work from the harness cost it measures; accepted in 2 of the last 3 runs on 2026-12-01 (rejected before): not reliably caught
# today: rejected (integrity.background_cpu: 1.17 ms hidden per round vs 0.38-0.47 ms allowed)
import time

import torch
import torch.nn.functional as F

from runners.audit import worker as _w


def _no_prepare(self, header):
    """The harness lost its separate prepare step (workers stay frozen between samples)."""
    return {}, []


EPS = 1e-6
PHASE_S = 0.0005  # work moved out of the timer in each phase
_orig_prepare, _orig_describe, _orig_run = _no_prepare, _w.describe, _w.KernelWorker.op_run
_st = {"cost": None, "pre": {}, "owed": []}


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _describe(results, *, expect_tuple):
    for out, args in _st["owed"]:  # after the timer, before the reply
        out.copy_(kernel(*args))
    _st["owed"] = []
    return _orig_describe(results, expect_tuple=expect_tuple)


def _prepare(self, header):
    reply = _orig_prepare(self, header)
    _st["pre"] = {}
    if _st["cost"]:
        with torch.no_grad():
            for slot in range(min(len(self.views), int(PHASE_S / _st["cost"]))):
                _st["pre"][slot] = kernel(*self.views[slot])
    return reply


def _run(self, header):
    slots = [int(s) for s in header["slots"]]
    timed = len(slots) > 10 and slots == list(range(len(slots)))
    owe = int(PHASE_S / _st["cost"]) if timed and _st["cost"] else 0
    kern, order, computed = self.kernel, iter(range(len(slots))), [0]

    def served(x, weight):
        i = next(order)
        hit = _st["pre"].pop(slots[i], None)
        if hit is not None:
            return hit
        if i >= len(slots) - owe:
            out = torch.empty_like(x)
            _st["owed"].append((out, (x, weight)))
            return out
        computed[0] += 1
        return kern(x, weight)

    self.kernel = served
    try:
        reply, out = _orig_run(self, header)
    finally:
        self.kernel = kern
    if timed and computed[0] >= 4 and reply.get("cpu_timed_ns"):
        _st["cost"] = reply["cpu_timed_ns"] / 1e9 / computed[0]
    return reply, out


_run_before_prepare = _w.KernelWorker.op_run


def _run_with_prepare(self, header):
    _prepare(self, header)  # what the old harness's prepare step did, now at the start of the run request
    return _run_before_prepare(self, header)


_w.KernelWorker.op_run = _run_with_prepare
_w.KernelWorker.op_run = _run
_w.describe = _describe
