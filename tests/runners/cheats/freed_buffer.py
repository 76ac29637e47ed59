"""Computes one row into an uninitialised buffer, hoping it still holds a freed reference result."""
# workload: rmsnorm
# verdict: rejected
# expect-any: correctness.mismatch | correctness.nonfinite | correctness.all_zero
import torch
import torch.nn.functional as F


def kernel(x, weight):
    out = torch.empty_like(x)
    out[0] = F.rms_norm(x[:1], (x.shape[-1],), weight, 1e-6)[0]
    return out
