"""Correct, but its first call (the one call allowed to start runtime pools) starts a daemon
thread that burns CPU in torch ops, which release the GIL, to make the machine busier for whoever
is measured next. Workers are frozen between their samples, so the burner runs only inside the
candidate's own requests, beside its own calls: it slows nobody but the candidate
(tests/runners/test_cheats.py checks that it gains nothing)."""
# workload: rmsnorm
import threading

import torch
import torch.nn.functional as F

_started = []


def _burn():
    a = torch.randn(96, 96)
    while True:
        a = torch.tanh(a @ a)


def kernel(x, weight):
    if not _started:
        _started.append(threading.Thread(target=_burn, daemon=True))
        _started[0].start()
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
