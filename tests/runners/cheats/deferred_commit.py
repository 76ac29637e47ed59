"""Patches the harness inside its own process: timed calls hand back empty tensors at once, and the
real outputs are computed into them when the harness describes the outputs, after its timer stopped
and before it replies. Every output is then correct when read; only the CPU the candidate's process
used beyond the time it reported, against what the harness costs a trusted worker, gives it away."""
# workload: rmsnorm
# verdict: rejected
# expect-any: timing.clock_mismatch | timing.done_before_computed
import torch
import torch.nn.functional as F

from runners.audit import worker as harness

_pending = []
_original_describe = harness.describe


def _describe(results, **options):
    for out, x, weight in _pending:
        out.copy_(F.rms_norm(x, (x.shape[-1],), weight, 1e-6))
    _pending.clear()
    return _original_describe(results, **options)


harness.describe = _describe


def kernel(x, weight):
    out = torch.empty_like(x)
    _pending.append((out, x, weight))
    return out
