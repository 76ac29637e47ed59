"""Class 4 (CPU allowances), against the stepped harness: work moved after the timer, sized from
the harness cost the candidate measures.

The harness grants one allowance per round for everything outside the timed calls:
round_cpu_abs_s + round_cpu_rel x the reported time. Before the timer there is nothing left to
precompute (no call's values exist before it is announced), so this candidate owes the last calls
of each timed sample instead: they return empty buffers at once, are reported done, and are
filled with F.rms_norm after the last call, before the reply (about twice the allowance, PHASE_S).
Every output is right when the sample ends. Two checks can see it: an output read the moment its
call was reported done (a secret few per round) is still empty, and the tree's CPU exceeds the
reported time by more than the allowance.
"""
# workload: rmsnorm
# verdict: rejected
# if-missed: accepted only at no billable gain (a race between its deferred work and the parent's reads and checks: on a VM whose cores wake and migrate slowly the work can land inside its own windows, where it moves no figure)
# expect-any: timing.done_before_computed | integrity.background_cpu | timing.clock_mismatch
# today: rejected (timing.done_before_computed)
import time

import torch
import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6
PHASE_S = 0.0006  # work moved out of the timer per sample
_orig_describe, _orig_run = _w.describe, _w.KernelWorker.op_run
_st = {"cost": None, "owed": []}


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _describe(results, *, expect_tuple):
    for out, args in _st["owed"]:  # after the timer, before the reply
        out.copy_(kernel(*args))
    _st["owed"] = []
    return _orig_describe(results, expect_tuple=expect_tuple)


def _run(self, header):
    slots = [int(s) for s in header["slots"]]
    timed = len(slots) > 10 and slots == list(range(len(slots)))
    owe = int(PHASE_S / _st["cost"]) if timed and _st["cost"] else 0
    kern, order, computed = self.kernel, iter(range(len(slots))), [0]

    def served(x, weight):
        i = next(order)
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
    spent = reply.get("timed_ns") or reply.get("cpu_timed_ns")
    if timed and computed[0] >= 4 and spent:
        _st["cost"] = spent / 1e9 / computed[0]
    return reply, out


_w.KernelWorker.op_run = _run
_w.describe = _describe
