"""Returns float64: more accurate, slower to move, and not what the workload returns."""
# workload: softmax
# verdict: rejected
# expect: correctness.dtype
import torch


def kernel(x):
    return torch.softmax(x.double(), dim=-1)
