"""Lookahead against the stepped harness: say a call is done before computing it, to be handed the
next call's inputs, and compute the two together.

The parent reveals call i+1's values only after the worker reports call i done. This candidate
replaces the worker's stepped loop (same process, so it can): on every even call it reports done
at once, with outputs that are empty buffers, and on the next call it computes both calls' RoPE in
one batched op over the two slots, writing the earlier call's results into the buffers it already
reported. Every output is computed inside a timed interval, by the baseline's arithmetic, before
the reply; no CPU is spent outside the timer; the final outputs of every call are right. What
differs: when the worker said call i was done, its outputs did not exist yet. A sound harness reads
a secret choice of outputs at that moment.
"""
# workload: rope
# verdict: rejected
# expect-any: timing.done_before_computed
# today: rejected, timing.done_before_computed in the first measured round
import time

import torch

from runners.audit import worker as _w


def _rot(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def kernel(q, k, cos, sin):
    return q * cos + _rot(q) * sin, k * cos + _rot(k) * sin


def _pair(a, b):
    q = torch.stack((a[0], b[0]))
    k = torch.stack((a[1], b[1]))
    cos = torch.stack((a[2], b[2]))[:, None, None]  # [2, 1, 1, S, D] against [2, B, H, S, D]
    sin = torch.stack((a[3], b[3]))[:, None, None]
    return kernel(q, k, cos, sin)


def _time_stepped(self, calls, results, first, base):
    clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    t_first = t_last = timed = cpu = 0
    owed = None
    for index in range(first, len(calls)):
        number = base + index + 1
        self._await(number)
        c0, t0 = cpu_clock(), clock()
        if owed is None and index + 1 < len(calls):
            q, k = calls[index][0], calls[index][1]
            results[index] = (torch.empty_like(q), torch.empty_like(k))  # "done", computed with the next call
            owed = index
        elif owed is not None:
            qo, ko = _pair(calls[owed], calls[index])
            results[owed][0].copy_(qo[0])
            results[owed][1].copy_(ko[0])
            results[index] = (qo[1], ko[1])
            owed = None
        else:
            results[index] = kernel(*calls[index])
        t1, c1 = clock(), cpu_clock()
        timed, cpu = timed + t1 - t0, cpu + c1 - c0
        t_first, t_last = t_first or t0, t1
        self._report_done(number, results[index])
    return {"t0": t_first, "t1": t_last, "timed_ns": timed, "cpu_timed_ns": cpu} if timed else {}


_w.KernelWorker._time_stepped = _time_stepped
