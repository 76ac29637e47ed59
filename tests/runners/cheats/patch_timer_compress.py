"""A subtler clock patch: timestamps stay plausible, but every second reading is pulled back so the
interval between a start and a stop reading shrinks to a tenth. Stepped samples bill the
parent's windows around each call, so the compressed claim moves nothing (it was rejected for
timing.clock_mismatch while the worker's timer billed)."""
# workload: rmsnorm
# verdict: no-billable-gain
import time

import torch.nn.functional as F

_real = time.perf_counter_ns
_start = []


def _compressed():
    now = _real()
    if not _start:
        _start.append(now)
        return now
    start = _start.pop()
    return start + (now - start) // 10


time.perf_counter_ns = _compressed


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
