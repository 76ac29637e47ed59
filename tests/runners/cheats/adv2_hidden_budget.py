"""Hidden work inside the run request (class 4, one allowance per round): before the harness
starts its timer, compute the first calls of the sample with the baseline's own op and serve them
from a memo inside the timer. Every output is computed, by the baseline's arithmetic, before the
reply, and the worker is frozen between samples, so the request is the only place left to hide
work; the tree's CPU beyond the reported time shows it. HIDE_S is about four times what the
allowance leaves (0.2 ms + 2% of the reported time), so a sound harness must see it; at a fifth of
it the gain would be within the allowance's ~5% and undetected by design."""
# workload: rmsnorm
# verdict: rejected
# expect-any: correctness.nondeterministic | correctness.all_zero | correctness.mismatch | correctness.timed_output_mismatch | timing.clock_mismatch | integrity.background_cpu
# today: rejected, timing.clock_mismatch (hidden ~1.1 ms per sample vs 0.29 ms allowed)
# since stepped samples (2026-12-01): rejected by the check phase (correctness.*): before the timer no slot of the sample holds values yet
import time

import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6
HIDE_S = 0.0012
_memo: dict = {}
_original_run = _w.KernelWorker.op_run


def kernel(x, weight):
    hit = _memo.pop(x.data_ptr(), None)
    return hit if hit is not None else F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _run(self, header):
    _memo.clear()
    end = time.thread_time() + HIDE_S
    for slot in dict.fromkeys(int(s) for s in header["slots"]):
        if time.thread_time() >= end:
            break
        x, weight = self.views[slot]
        _memo[x.data_ptr()] = F.rms_norm(x, (x.shape[-1],), weight, EPS)
    return _original_run(self, header)


_w.KernelWorker.op_run = _run
