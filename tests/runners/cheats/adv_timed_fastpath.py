"""Class 6 (correctness calls and timed calls can be told apart), against the new harness.

Every call now comes through the same op_run on slot views of one mapping, but the request still
says which phase it is: a correctness check is 2 x len(distributions) slots in equal-valued pairs
(the re-validation 2 x revalidate_sets), the probe's identical batch is one slot repeated, a timed
sample is range(calls). When the sample looks timed, RMSNorm drops eps and normalises with the
BLAS vector norm (correct to ~1e-7 when a row's mean square is ~1, 5% off on the "small"
distribution). A sound harness puts check-distribution values among timed calls where the
candidate cannot tell which (the secret "special" call, always verified).
"""
# workload: rmsnorm
# verdict: rejected
# if-missed: accepted only at no billable gain (when its guess of which samples are timed fails, e.g. when calibration on a slow VM gives few calls a sample, it computes honestly and gains nothing)
# expect-any: correctness.mismatch | correctness.timed_output_mismatch
# today: rejected (correctness.timed_output_mismatch in round 5, special call of the 'small' distribution)
import torch
import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6
_original_run = _w.KernelWorker.op_run
_st = {"timed": False}


def kernel(x, weight):
    if not _st["timed"]:
        return F.rms_norm(x, (x.shape[-1],), weight, EPS)
    scale = weight * x.shape[-1] ** 0.5
    return torch.mul(x, scale).div_(torch.linalg.vector_norm(x, dim=-1, keepdim=True))


def _run(self, header):
    slots = [int(s) for s in header["slots"]]
    _st["timed"] = len(slots) > 10 and slots == list(range(len(slots)))
    try:
        return _original_run(self, header)
    finally:
        _st["timed"] = False


_w.KernelWorker.op_run = _run
