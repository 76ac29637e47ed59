"""Correct, but its first call (the one call allowed to start runtime pools) starts a daemon
thread that burns CPU in torch ops, which release the GIL, so the candidate's own calls stay
fast while the machine is busier for whoever is measured next. Caught by the CPU the worker
uses outside its timed windows."""
# workload: rmsnorm
# verdict: rejected
# expect-any: integrity.background_cpu | timing.clock_mismatch
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
