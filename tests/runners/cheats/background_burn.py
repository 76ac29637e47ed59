"""Correct, but its first call (the one call allowed to start runtime pools) starts a daemon
thread that burns CPU in torch ops, which release the GIL, so the candidate's own calls stay
fast while the machine is busier for whoever is measured next. It used to be caught by the CPU the
worker used outside its timed windows; every arm is now frozen from the end of its sample to its
next request, so the thread burns only inside the candidate's own windows, which it slows. Since
the parent holds the worker's core between calls (2026-12-05, sixth session) the thread no longer
runs in the gaps either: it takes a scheduler slice in some windows and none in others, so the
candidate reads slower with a wide interval (0.75-1.0x, lower bounds 0.42-0.91, 3 seeds) rather
than 0.38x with a tight one. Its target, whoever is measured next, is judged by the next-arm and
interference figures; its own figure never bills above 1.
"""
# workload: rmsnorm
# verdict: no-billable-gain
# today: accepted at 0.75-1.0x, CI low 0.42-0.91 (2026-12-05, held fence); 0.38-0.39x, CI high 0.44-0.53 before
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
