"""Patches the harness inside its own process: timed calls hand back empty tensors at once, and the
real outputs are computed into them when the harness reads them to commit checksums, outside the
timer. Checksums and fetched outputs are then all correct; only the CPU that the window costs the
process, beyond what the harness costs a trusted worker, gives it away."""
# workload: rmsnorm
# verdict: rejected
# expect: timing.clock_mismatch
import torch
import torch.nn.functional as F

from runners import measure

_timed = False
_pending = []
_original_run = measure.ChildRunner.op_run
_original_commit = measure.ChildRunner.op_commit


def _run(self, header):
    global _timed
    _timed = True
    _pending.clear()
    try:
        return _original_run(self, header)
    finally:
        _timed = False


def _commit(self, header):
    for out, x, weight in _pending:
        out.copy_(F.rms_norm(x, (x.shape[-1],), weight, 1e-6))
    _pending.clear()
    return _original_commit(self, header)


measure.ChildRunner.op_run = _run
measure.ChildRunner.op_commit = _commit


def kernel(x, weight):
    if _timed:
        out = torch.empty_like(x)
        _pending.append((out, x, weight))
        return out
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
