"""Correct, but a daemon thread started at import burns CPU between calls, slowing whoever is
measured next (the baseline) on a shared machine. Refused at load, before any call."""
# workload: rmsnorm
# verdict: rejected
# expect: integrity.thread_left_running
import threading

import torch.nn.functional as F


def _spin():
    value = 0
    while True:
        value = (value * 31 + 7) % 1000003


threading.Thread(target=_spin, daemon=True).start()


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
