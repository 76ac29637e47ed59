"""Class 5 (which timed calls get verified is predictable), against the new harness.

The verified calls are now drawn from the OS RNG after the outputs are frozen (kernel._CHALLENGE),
so the audit seed no longer predicts them. What a candidate can still see: one call per round (the
"special" call) reads values of a check distribution (uniform, outliers, heavy-tailed, small) and
is always verified. Its values stand out (range, max |x|, mean square), so the candidate spots it
and computes it; every other call of a timed sample returns an uninitialised tensor at once.
Correctness-check samples (slot pairs holding equal values) and the caching probe are served
honestly. The two calls drawn at random per round then land on uncomputed outputs.
(Skipping only k of n calls per round escapes detection with probability ~(1 - 2k/n)^rounds:
for k=1 of 86 rmsnorm calls over 16 rounds that is ~0.47; see the report.)

A check sample is told apart by its values, not by its length (a loaded box calibrates timed
samples down to a check's few calls, and a length test then served every sample honestly): a
check's second call repeats its first call's values, a timed sample's never does.
"""
# workload: softmax
# verdict: rejected
# expect-any: correctness.timed_output_mismatch
# today: rejected (correctness.timed_output_mismatch in round 1)
import torch

from runners.audit import worker as _w

_original_run = _w.KernelWorker.op_run
_st = {"probe": False, "calls": 0, "first": None, "skip": False}


def _odd(x):
    flat = x.reshape(-1)
    ms = float(flat.square().mean())
    return ms < 0.5 or ms > 1.6 or float(flat.abs().max()) > 6.0 or float(flat.abs().max()) < 1.8


def kernel(x):
    calls = _st["calls"]
    _st["calls"] = calls + 1
    if not _st["probe"]:
        if calls == 0:
            _st["first"] = x.clone()
        elif calls == 1:
            # A check repeats its first call's values in its second; a timed sample never does.
            _st["skip"] = not torch.equal(x, _st["first"])
    if _st["skip"] and not _odd(x):
        return torch.empty_like(x)
    return torch.softmax(x, dim=-1)


def _run(self, header):
    slots = [int(s) for s in header["slots"]]
    # The caching probe repeats one slot: served honestly.
    _st.update(probe=len(set(slots)) == 1, calls=0, first=None, skip=False)
    try:
        return _original_run(self, header)
    finally:
        _st.update(calls=0, first=None, skip=False)


_w.KernelWorker.op_run = _run
