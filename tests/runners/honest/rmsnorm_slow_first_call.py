"""The baseline's rmsnorm, with 12 ms of waiting in the first call of every request (a cold start:
a pool woken, a buffer mapped). Every call's window bills, the first one's too (since 2026-12-05,
sixth session: an unbilled first call was a window where work for the later calls was free), so
the candidate is accepted and reads as slow as its cold starts make it."""
import time

import torch.nn.functional as F

from runners.audit import worker as _w

_original_run = _w.KernelWorker.op_run
_first = [False]


def kernel(x, weight):
    if _first[0]:
        _first[0] = False
        time.sleep(0.012)
    return F.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)


def _run(self, header):
    _first[0] = True
    return _original_run(self, header)


_w.KernelWorker.op_run = _run
