"""Class 3 (a memo that hits because inputs repeat), against the new harness.

Timed inputs are no longer windows into one small pool: every call of a sample reads its own slot
of fresh values, rewritten every round, so there is no overlap to memoise. The residual memo is
keyed by input address and cleared whenever the parent writes new values (the candidate hooks
`prepare`): it never returns stale outputs and never hits in a timed sample; it hits only when a
sample repeats a slot, which the caching probe's identical batch does, so the probe shows a gap
only the candidate has. (What remains of "inputs are windows into one mapping" is lookahead
batching across a sample's slots: adv_pool_memo.py and adv2_lookahead_*.py.)
"""
# workload: rmsnorm
# verdict: rejected
# expect-any: timing.caching_suspected
# today: rejected (timing.caching_suspected: identical 0.04x distinct for the candidate, 0.94x for the baseline)
import torch.nn.functional as F

from runners.audit import worker as _w


def _no_prepare(self, header):
    """The harness lost its separate prepare step (workers stay frozen between samples)."""
    return {}, []


EPS = 1e-6
_memo: dict = {}
_original_prepare = _no_prepare


def kernel(x, weight):
    key = (x.data_ptr(), weight.data_ptr())
    out = _memo.get(key)
    if out is None:
        out = _memo[key] = F.rms_norm(x, (x.shape[-1],), weight, EPS)
    return out


def _prepare(self, header):
    _memo.clear()  # the parent has just written new values: nothing memoised is valid
    return _original_prepare(self, header)


_run_before_prepare = _w.KernelWorker.op_run


def _run_with_prepare(self, header):
    _prepare(self, header)  # what the old harness's prepare step did, now at the start of the run request
    return _run_before_prepare(self, header)


_w.KernelWorker.op_run = _run_with_prepare
