"""Returns a tensor subclass that would defer or fake its values when someone looks."""
# workload: rmsnorm
# verdict: rejected
# expect: correctness.output_type
import torch
import torch.nn.functional as F


class Lazy(torch.Tensor):
    pass


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6).as_subclass(Lazy)
