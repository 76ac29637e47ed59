"""Normalises only the first two rows and leaves the rest zero."""
# workload: rmsnorm
# verdict: rejected
# expect: correctness.mismatch
import torch
import torch.nn.functional as F


def kernel(x, weight):
    out = torch.zeros_like(x)
    out[:2] = F.rms_norm(x[:2], (x.shape[-1],), weight, 1e-6)
    return out
