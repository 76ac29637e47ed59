"""Deferred work that races the parent's snapshot: compute the head of each call's output in the
timed interval, report the call done, and finish the tail while the parent is still reading.

The parent reads a secretly chosen call's outputs the moment the worker reports it done; if it read
them front to back, a worker that defers only the last part of each output (here the last 40% of
the rows) could finish it while the read is still on the first part, so every snapshot would hold
the finished output and the deferred rows would be computed outside every timer, in the gap the
parent spends reading and revealing the next call. A sound harness reads a snapshot in an order
the worker cannot predict and compares it with the final outputs, so a write that lands after the
report shows as a snapshot that does not hold the outputs reported later.
"""
# workload: rmsnorm
# verdict: rejected
# if-missed: accepted only at no billable gain (a race between its deferred work and the parent's reads and checks: on a VM whose cores wake and migrate slowly the work can land inside its own windows, where it moves no figure)
# expect-any: timing.done_before_computed | timing.clock_mismatch | integrity.background_cpu
# today: rejected
import time

import torch
import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6
HEAD = 0.6


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _time_stepped(self, calls, results, first, base):
    clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    t_first = t_last = timed = cpu = 0
    for index in range(first, len(calls)):
        number = base + index + 1
        self._await(number)
        x, weight = calls[index]
        split = int(x.shape[0] * HEAD)
        c0, t0 = cpu_clock(), clock()
        out = torch.empty_like(x)
        out[:split] = kernel(x[:split], weight)
        t1, c1 = clock(), cpu_clock()
        results[index] = out
        timed, cpu = timed + t1 - t0, cpu + c1 - c0
        t_first, t_last = t_first or t0, t1
        self._report_done(number, out)
        out[split:] = kernel(x[split:], weight)  # while the parent reads the head, untimed
    return {"t0": t_first, "t1": t_last, "timed_ns": timed, "cpu_timed_ns": cpu} if timed else {}


_w.KernelWorker._time_stepped = _time_stepped
