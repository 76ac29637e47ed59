"""Batches a whole stepped sample behind done records that claim one byte of output.

The parent reveals call i+1 only once call i is reported done, and checks "done" by reading a
secret few calls' outputs at that moment and comparing them with what the frozen worker holds at
the end. How many bytes that read covered used to be the worker's word (the byte count in its done
record): every call but the last reported done at once with a one-byte span over a byte it had
zeroed beforehand, and the last call ran the sequential scan for all of them in one loop (the
per-step dispatch paid once a sample, not once a call): 2.11x [1.77, 3.05], A/A-stable and
billable. The parent now takes no snapshot shorter than a dense output of the workload's shape,
and requires every snapshot to cover the whole output as the worker finally describes it.
"""
# workload: ssm_scan
# verdict: rejected
# expect: timing.done_before_computed
# today: 2.11x [1.77, 3.05] billable before the fix (2026-12-05, cpu-ci); rejected after

import time

import torch

from runners import suite
from runners.audit import worker as _w
from runners.audit.inputs import DoneRecord
from runners.suite import ssm_scan_baseline as kernel  # first call of the worker: honest


def _batched_scan(cs):
    u = torch.stack([c[0] for c in cs])        # (k, B, D, L)
    k, b, d, l = u.shape
    delta = torch.stack([c[1] for c in cs]).reshape(k * b, d, l)
    A = torch.stack([c[2] for c in cs])        # (k, D, N)
    n = A.shape[-1]
    A = A[:, None].expand(k, b, d, n).reshape(k * b, d, n)
    Bm = torch.stack([c[3] for c in cs]).reshape(k * b, n, l)
    Cm = torch.stack([c[4] for c in cs]).reshape(k * b, n, l)
    Dv = torch.stack([c[5] for c in cs])[:, None].expand(k, b, d).reshape(k * b, d)
    u = u.reshape(k * b, d, l)
    delta_a = torch.exp(delta.unsqueeze(-1) * A[:, :, None, :])
    delta_b_u = (delta * u).unsqueeze(-1) * Bm.transpose(1, 2)[:, None, :, :]
    state = u.new_zeros(k * b, d, n)
    ys = []
    for step in range(l):
        state = delta_a[:, :, step] * state + delta_b_u[:, :, step]
        ys.append(torch.einsum("bdn,bn->bd", state, Cm[:, :, step]))
    y = torch.stack(ys, dim=2) + u * Dv[:, :, None]
    return y.reshape(k, b, d, l)


def _time_stepped(self, calls, results, first, base):
    clock = time.perf_counter_ns
    done, counter = self.done, self.counter
    NUM, ADDR, SPAN = DoneRecord.NUMBER, DoneRecord.OUTPUTS, DoneRecord.OUTPUTS + 1
    shape = suite.output_shapes(self.spec)[0]
    k = len(calls) - first
    if k <= 0:
        return {}
    buf = torch.empty((k, *shape), dtype=self.spec.torch_dtype)
    head = buf.view(k, -1).view(torch.uint8)[:, 0]
    head.zero_()
    t_first = t_last = timed = 0
    last = len(calls) - 1
    for index in range(first, len(calls)):
        number = base + index + 1
        while counter.value != number:
            pass
        t0 = clock()
        out = buf[index - first]
        if index == last:
            buf.copy_(_batched_scan(calls[first:]))
            head.zero_()
            span = out.numel() * out.element_size()
        else:
            span = 1
        t1 = clock()
        results[index] = out
        timed += t1 - t0
        t_first = t_first or t0
        t_last = t1
        done[ADDR] = out.data_ptr()
        done[SPAN] = span
        done[NUM] = number
    return {"t0": t_first, "t1": t_last, "timed_ns": timed}


_w.KernelWorker._time_stepped = _time_stepped
