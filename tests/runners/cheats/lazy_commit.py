"""Patches the harness inside its own process: timed calls return garbage at once, and only the
outputs the parent later asks for are computed, when they are fetched. Outputs read from the frozen
worker (or the checksums committed when the sample ended) give it away. Check sets run through
the same op_run, so its garbage is often caught there first: as a mismatch, a second call that
differs, or NaN, whatever the uninitialised memory held (a CI run saw the last two)."""
# workload: rmsnorm
# verdict: rejected
# expect-any: integrity.commitment_mismatch | correctness.timed_output_mismatch | correctness.mismatch | correctness.nondeterministic | correctness.nonfinite
import torch
import torch.nn.functional as F

from runners.audit import worker as harness

_timed = False
_args = []
_original_run = harness.KernelWorker.op_run
_original_fetch = harness.KernelWorker.op_fetch


def _run(self, header):
    global _timed
    _timed = True
    _args.clear()
    try:
        return _original_run(self, header)
    finally:
        _timed = False


def _fetch(self, header):
    for index in header["indices"]:
        x, weight = _args[int(index)]
        self.outputs[int(index)] = [F.rms_norm(x, (x.shape[-1],), weight, 1e-6)]
    return _original_fetch(self, header)


harness.KernelWorker.op_run = _run
harness.KernelWorker.op_fetch = _fetch


def kernel(x, weight):
    if _timed and len(_args) > 0:
        _args.append((x, weight))
        return torch.empty_like(x)
    _args.append((x, weight))
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
