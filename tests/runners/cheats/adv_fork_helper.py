"""Class 1 (helper processes invisible to CPU accounting), against the new harness.

The worker's cgroup now counts every process it starts, confines them to the measurement cores,
and freezes them all when the reply arrives. The strongest remaining form: in a timed sample the
worker computes the first half of the calls itself and forks a helper that computes the second
half into shared memory after the worker's timer has stopped, so the timer only covers half the
work; the helper's outputs live in a MAP_SHARED mapping the worker returns views of.
Correctness checks and the caching probe are served honestly.
"""
# workload: rmsnorm
# verdict: rejected
# if-missed: accepted only at no billable gain (a race between its deferred work and the parent's reads and checks: on a VM whose cores wake and migrate slowly the work can land inside its own windows, where it moves no figure)
# expect-any: integrity.stray_process | timing.clock_mismatch | correctness.timed_output_mismatch
# today: rejected (integrity.stray_process at the caching probe)
import mmap
import os

import torch
import torch.nn.functional as F

from runners.audit import worker as _w


def _no_prepare(self, header):
    """The harness lost its separate prepare step (workers stay frozen between samples)."""
    return {}, []


EPS = 1e-6
_original_run, _original_prepare = _w.KernelWorker.op_run, _no_prepare
_st = {"defer": None}


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _run(self, header):
    slots = [int(s) for s in header["slots"]]
    if len(slots) <= 10 or slots != list(range(len(slots))):
        return _original_run(self, header)
    half = len(slots) // 2
    shape = self.views[0][0].shape
    numel = self.views[0][0].numel()
    shared = mmap.mmap(-1, numel * 4 * (len(slots) - half))
    outs = torch.frombuffer(shared, dtype=torch.float32).view(len(slots) - half, *shape)
    _st["keep"] = (shared, outs)
    calls = iter(range(len(slots)))
    kern = self.kernel

    def split(x, weight):
        i = next(calls)
        if i < half:
            return kern(x, weight)
        if i == half:
            if os.fork() == 0:  # the helper: the rest of the sample, after the timer
                try:
                    for j in range(half, len(slots)):
                        outs[j - half].copy_(kern(*self.views[slots[j]]))
                finally:
                    os._exit(0)
        return outs[i - half]

    self.kernel = split
    try:
        return _original_run(self, header)
    finally:
        self.kernel = kern


def _prepare(self, header):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    return _original_prepare(self, header)


_w.KernelWorker.op_run = _run
_run_before_prepare = _w.KernelWorker.op_run


def _run_with_prepare(self, header):
    _prepare(self, header)  # what the old harness's prepare step did, now at the start of the run request
    return _run_before_prepare(self, header)


_w.KernelWorker.op_run = _run_with_prepare
