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
"""
# workload: softmax
# verdict: rejected
# expect-any: correctness.timed_output_mismatch
# today: rejected (correctness.timed_output_mismatch in round 1)
import torch

from runners.audit import worker as _w

_original_run = _w.KernelWorker.op_run
_st = {"skip": False}


def _odd(x):
    flat = x.reshape(-1)
    ms = float(flat.square().mean())
    return ms < 0.5 or ms > 1.6 or float(flat.abs().max()) > 6.0 or float(flat.abs().max()) < 1.8


def kernel(x):
    if _st["skip"] and not _odd(x):
        return torch.empty_like(x)
    return torch.softmax(x, dim=-1)


def _run(self, header):
    slots = [int(s) for s in header["slots"]]
    # Checks: 2 x distributions slots in equal pairs; probe identical: one slot repeated.
    check = len(slots) <= 10 or len(set(slots)) == 1
    _st["skip"] = not check
    try:
        return _original_run(self, header)
    finally:
        _st["skip"] = False


_w.KernelWorker.op_run = _run
