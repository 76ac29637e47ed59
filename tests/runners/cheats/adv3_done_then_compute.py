"""Work moved out of the timed interval of a stepped sample: report each call done with an empty
output, then compute it while the parent reveals the next call.

Inside its timed interval a call only allocates its output; right after reporting it done, the
worker computes F.rms_norm into that buffer, in the gap the parent spends copying the next call's
values, which no timer covers. Every output is right before the reply. The worker's CPU exceeds
what its timer claims by nearly all of the work, and any output read the moment it was reported
done is still empty.
"""
# workload: rmsnorm
# verdict: rejected
# expect-any: timing.done_before_computed | timing.clock_mismatch | integrity.background_cpu
# today: rejected (timing.done_before_computed and timing.clock_mismatch)
import time

import torch
import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _time_stepped(self, calls, results, first, base):
    clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    t_first = t_last = timed = cpu = 0
    for index in range(first, len(calls)):
        number = base + index + 1
        self._await(number)
        c0, t0 = cpu_clock(), clock()
        out = torch.empty_like(calls[index][0])
        t1, c1 = clock(), cpu_clock()
        results[index] = out
        timed, cpu = timed + t1 - t0, cpu + c1 - c0
        t_first, t_last = t_first or t0, t1
        self._report_done(number, out)
        out.copy_(kernel(*calls[index]))  # after "done", before the next call is announced
    return {"t0": t_first, "t1": t_last, "timed_ns": timed, "cpu_timed_ns": cpu} if timed else {}


_w.KernelWorker._time_stepped = _time_stepped
