"""Returns zeros and patches every comparison function it can find to say 'equal'."""
# workload: rmsnorm
# verdict: rejected
# expect: correctness.all_zero
import numpy
import torch
import torch.testing


def _always(*args, **kwargs):
    return True


torch.allclose = _always
torch.equal = _always
torch.testing.assert_close = lambda *a, **k: None
numpy.allclose = _always


def kernel(x, weight):
    return torch.zeros_like(x)
