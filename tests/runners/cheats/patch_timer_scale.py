"""Monkeypatches the clock in its own process so every timed interval looks 5x shorter."""
# workload: rmsnorm
# verdict: rejected
# expect: timing.clock_mismatch
import sys
import time

import torch.nn.functional as F

_real = time.perf_counter_ns


def _fast():
    return _real() // 5


time.perf_counter_ns = _fast
for module in list(sys.modules.values()):  # also names imported with `from time import ...`
    if getattr(module, "perf_counter_ns", None) is _real:
        module.perf_counter_ns = _fast


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
