"""Shrinks the done record the parent reads while it steps a sample (a file in the worker's own
scratch directory, which the worker must be able to write).

The parent used to map that file and poll it with plain loads: once the worker truncated it, the
next load faulted (SIGBUS), the harness died without a result and left the worker frozen. The
parent now reads the record with pread, which comes back short and never faults: the candidate's
own process dies of the fault when it next writes the record, and the audit ends normally with
that as its verdict.
"""
# workload: rmsnorm
# verdict: error
# expect: sandbox.crash
# today: error (the worker died from SIGBUS); the harness process itself died (rc 135) while it mapped the record
import glob
import os

import torch.nn.functional as F


def _shrink() -> None:
    for path in glob.glob(os.path.join(os.getcwd(), "done-*")):
        try:
            os.truncate(path, 0)
        except OSError:
            pass


_shrink()


def kernel(x, weight):
    _shrink()
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
