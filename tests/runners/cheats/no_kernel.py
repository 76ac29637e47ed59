"""Defines everything except `kernel`."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.no_kernel
import torch.nn.functional as F


def rmsnorm(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
