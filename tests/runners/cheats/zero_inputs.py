"""Computes the right answer, then zeroes its input (destroying evidence a harness might re-check)."""
# workload: rmsnorm
# verdict: rejected
# expect: integrity.input_mutated
import torch.nn.functional as F


def kernel(x, weight):
    out = F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
    x.zero_()
    return out
