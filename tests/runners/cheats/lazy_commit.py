"""Patches the harness inside its own process: timed calls return garbage at once, and only the
outputs the parent later asks for are computed, at fetch time. The checksums committed when the
window closed give it away."""
# workload: rmsnorm
# verdict: rejected
# expect-any: integrity.commitment_mismatch | correctness.timed_output_mismatch
import torch
import torch.nn.functional as F

from runners import measure

_timed = False
_args = []
_original_run = measure.ChildRunner.op_run
_original_fetch = measure.ChildRunner.op_fetch


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


measure.ChildRunner.op_run = _run
measure.ChildRunner.op_fetch = _fetch


def kernel(x, weight):
    if _timed:
        _args.append((x, weight))
        return torch.empty_like(x)
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
