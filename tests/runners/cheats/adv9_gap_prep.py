"""Per-call work moved into the gap between calls: a candidate replaces the harness's stepped loop
with one that, right after each call's done record, prepares the next call before it waits for the
announcement: unpacks its arguments, builds its shape tuple, and runs 30 us of input-independent
set-up (here a stand-in busy loop, as a launcher's per-call planning would be). None of that
reads a value, so nothing but the billing tells it apart from work done in the call.

A red team (2026-12-05) billed 1.06-1.075x against `cpu-ci` rmsnorm with a leaner loop that moved
its per-call set-up there, while the parent moved onto the worker's core only to copy each call's
values: from the done record to that move (35-50 us on a VM) the worker ran unwatched, so this
file's 30 us of set-up cost it nothing (1.00-1.02x, 3 of 3 seeds, CI across 1). The parent now
holds the core from the done record to the next announcement (sample.CoreFence): the set-up runs
inside the next call's window, and the candidate reads as much slower as it is.
"""
# workload: rmsnorm
# verdict: no-gain
# today: accepted at 1.00-1.02x (set-up free) before the held fence; CI wholly below 1 with it
import time

import torch.nn.functional as F

from runners.audit import worker as _w
from runners.audit.inputs import DoneRecord

EPS = 1e-6
SETUP_NS = 30_000


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _set_up(clock):
    until = clock() + SETUP_NS
    while clock() < until:
        pass


def _time_stepped(self, calls, results, first, base):
    counter, done, run, clock = self.counter, self.done, F.rms_norm, time.perf_counter_ns
    number_word, output_word = DoneRecord.NUMBER, DoneRecord.OUTPUTS
    futex = getattr(_w, "futex", None)
    wake = futex.wake if futex is not None else (lambda address: None)
    address = getattr(self, "counter_address", 0)
    if first >= len(calls):
        return {}
    x, weight = calls[first]
    shape = (x.shape[-1],)
    _set_up(clock)
    t_first, timed = clock(), 0
    for index in range(first, len(calls)):
        number = base + index + 1
        while counter.value != number:
            pass
        t0 = clock()
        result = run(x, shape, weight, EPS)
        timed += clock() - t0
        results[index] = result
        if index == first:
            self._report_done(number, result)  # the full record once (wakes the parent itself)
        else:
            done[output_word] = result.data_ptr()
            done[number_word] = number
            wake(address)
        if index + 1 < len(calls):  # after the done record, before the next announcement
            x, weight = calls[index + 1]
            shape = (x.shape[-1],)
            _set_up(clock)
    return {"t0": t_first, "t1": clock(), "timed_ns": timed}


_w.KernelWorker._time_stepped = _time_stepped
