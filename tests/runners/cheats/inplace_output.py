"""Writes the result into its input buffer and returns that buffer (saves an allocation)."""
# workload: rmsnorm
# verdict: rejected
# expect-any: integrity.input_mutated | integrity.output_aliases_input
import torch.nn.functional as F


def kernel(x, weight):
    x.copy_(F.rms_norm(x, (x.shape[-1],), weight, 1e-6))
    return x
