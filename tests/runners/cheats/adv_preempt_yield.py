"""Class 2 (the preemption discount trusts any run-queue wait), against the new harness.

The discount now never takes a sample below the CPU the worker's whole tree (its cgroup) used in
the request, so a same-core helper's work is no longer subtracted. The strongest remaining form
keeps the old shape: a helper process, forked at the first `prepare` and kept for the whole audit
(forking per sample would put the fork's cost inside the timer), runs the real scan on the worker's
core while the calling thread spins on sched_yield() inside the timer, runnable but waiting. The
helper's CPU is the tree's, so the floor keeps the sample at (at least) the real work; and the
helper is alive whenever a sample ends.
"""
# workload: ssm_scan
# verdict: rejected
# expect-any: integrity.stray_process | timing.clock_mismatch
# today: rejected (integrity.stray_process at the first check)
import mmap
import os
import struct

import torch

from runners import suite
from runners.audit import worker as _w


def _no_prepare(self, header):
    """The harness lost its separate prepare step (workers stay frozen between samples)."""
    return {}, []


_original_prepare = _no_prepare
_st = {"pid": None, "ctl": None, "out": None, "self": None}


def _helper(ctl, out, worker):
    while True:
        seq, slot = struct.unpack_from("qq", ctl, 0)
        done = struct.unpack_from("q", ctl, 16)[0]
        if seq != done:
            y = suite.ssm_scan_baseline(*worker.views[slot])
            out[: y.numel()].copy_(y.reshape(-1))
            struct.pack_into("q", ctl, 16, seq)
        else:
            os.sched_yield()


def _slot_of(worker, u):
    for slot, views in enumerate(worker.views):
        if views[0].data_ptr() == u.data_ptr():
            return slot
    return -1


def kernel(u, delta, A, B, C, D):
    worker = _st["self"]
    slot = _slot_of(worker, u) if worker is not None and _st["pid"] else -1
    if slot < 0:
        return suite.ssm_scan_baseline(u, delta, A, B, C, D)
    ctl, out = _st["ctl"], _st["out"]
    seq = struct.unpack_from("q", ctl, 0)[0] + 1
    struct.pack_into("qq", ctl, 0, seq, slot)
    while struct.unpack_from("q", ctl, 16)[0] != seq:
        os.sched_yield()  # runnable, waiting for the core the helper holds
    return out[: u.numel()].view(u.shape).clone()


def _prepare(self, header):
    reply = _original_prepare(self, header)
    if _st["pid"] is None and self.views:
        _st["self"] = self
        _st["ctl"] = mmap.mmap(-1, 4096)
        _st["out"] = torch.frombuffer(mmap.mmap(-1, 1 << 20), dtype=torch.float32)
        pid = os.fork()
        if pid == 0:
            try:
                _helper(_st["ctl"], _st["out"], self)
            finally:
                os._exit(0)
        _st["pid"] = pid
    return reply


_run_before_prepare = _w.KernelWorker.op_run


def _run_with_prepare(self, header):
    _prepare(self, header)  # what the old harness's prepare step did, now at the start of the run request
    return _run_before_prepare(self, header)


_w.KernelWorker.op_run = _run_with_prepare
