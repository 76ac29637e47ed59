"""Starts each call before it is announced, on the values that have already landed.

The parent copies call i's values into the file the worker maps, then announces call i. The file
holds zeros until a slot is copied, so a worker that watches the end of `gate` knows when gate
has landed: it computes silu(gate) while `up` is still being copied, and only the product is
left for the call's window. An outside red team billed 1.38-1.57x on swiglu this way while the
worker could run during the copy. The parent now copies each call's values while it holds the
worker's only core (a real-time thread on the measurement core: nothing of the worker's tree can
run), so there is nothing to watch.
"""
# workload: swiglu
# verdict: no-billable-gain
# today: accepted at about 1x (with the worker running during the copy: see docs/protocol.md)
import time

import torch
import torch.nn.functional as F

from runners.audit import worker as _w


def kernel(gate, up):
    return F.silu(gate) * up


def _landed(flat) -> bool:
    # Several positions, not only the last: a wide copy need not land in address order.
    n = len(flat)
    return flat[n - 1] != 0 and flat[n // 2] != 0 and flat[n - 2] != 0 and flat[0] != 0


def _time_stepped(self, calls, results, first, base):
    counter, clock = self.counter, time.perf_counter_ns
    t_first, timed = clock(), 0
    for index in range(first, len(calls)):
        number = base + index + 1
        gate, up = calls[index]
        flat, flat_up = gate.reshape(-1).numpy(), up.reshape(-1).numpy()
        early = full = None
        while counter.value != number:
            if early is None:
                if _landed(flat):
                    early = F.silu(gate)
            elif full is None and _landed(flat_up):
                full = early * up
        t0 = clock()
        if full is None:
            full = early * up if early is not None else kernel(gate, up)
        results[index] = result = full
        timed += clock() - t0
        self._report_done(number, result)
    return {"t0": t_first, "t1": clock(), "timed_ns": max(1, timed)} if timed else {}


_w.KernelWorker._time_stepped = _time_stepped
