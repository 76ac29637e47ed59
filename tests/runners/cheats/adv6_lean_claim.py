"""The worker's own timer under-reports: a candidate replaces the harness's stepped loop in its
own process with a leaner one that claims 92% of what each call took (inside the hidden-work allowance of the time).

Every call is computed in full, inside its window, with the right outputs; only the figure the
worker reports is smaller. Billing the worker's timer paid this (1.2x to 1.6x on rmsnorm, under
the hidden-work allowance). The parent's own clock around each call bills now; the claim is only
held to fit inside it, so the lean loop gains nothing.
"""
# workload: rmsnorm
# verdict: no-billable-gain
# today: accepted, 1.011x [0.971, 1.048]; billable 1.103x [1.049, 1.164] while the worker's timer billed
import time

import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _time_stepped(self, calls, results, first, base):
    counter, clock, run = self.counter, time.perf_counter_ns, self.kernel
    t_first, timed = clock(), 0
    for index in range(first, len(calls)):
        number = base + index + 1
        while counter.value != number:
            pass
        t0 = clock()
        results[index] = result = run(*calls[index])
        timed += clock() - t0
        self._report_done(number, result)
    return {"t0": t_first, "t1": clock(), "timed_ns": max(1, int(timed * 0.92))} if timed else {}


_w.KernelWorker._time_stepped = _time_stepped
