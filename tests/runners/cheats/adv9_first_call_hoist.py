"""Every call's input-independent set-up hoisted to the start of the sample: a candidate that does
30 us of set-up a call (a stand-in busy loop, as a launcher's per-call planning would be) does all
of it at once before it is ready for its first call, and none in its calls.

Until 2026-12-05 (sixth session) call 0's window held the worker's reading of the request and did
not bill, so set-up placed in it cost nothing at any size (this file, setting up in call 0: the
same as the baseline, 1.0x, for 4 ms of work a sample). Now the worker says "ready" after reading
the request, call 0 is announced after that and bills like any call, and what a worker does before
"ready" is time outside its windows, held to the trusted workers' within the hidden-work
allowance: all of this set-up there is rejected; set-up within the allowance (0.2 ms + 2% of a
sample) is the bound on what it buys.
"""
# workload: rmsnorm
# verdict: no-gain
# expect-any: timing.clock_mismatch | integrity.background_cpu
# today: rejected (timing.clock_mismatch); 1.0x, billable, before the ready handshake
import time

import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6
SETUP_NS = 30_000


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _set_up(calls):
    until = time.perf_counter_ns() + SETUP_NS * calls
    while time.perf_counter_ns() < until:
        pass


_report_ready = getattr(_w.KernelWorker, "_report_ready", None)
if _report_ready is not None:
    def _hoisted_ready(self, base):
        _set_up(len(self.views))  # one slot per call of a sample
        _report_ready(self, base)

    _w.KernelWorker._report_ready = _hoisted_ready
else:  # the harness before the handshake: set up inside call 0, which did not bill
    _time_stepped = _w.KernelWorker._time_stepped

    def _hoisted_first(self, calls, results, first, base):
        counter = self.counter
        while counter.value != base + first + 1:
            pass
        _set_up(len(calls))
        return _time_stepped(self, calls, results, first, base)

    _w.KernelWorker._time_stepped = _hoisted_first
