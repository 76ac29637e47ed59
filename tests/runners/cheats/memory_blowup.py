"""Allocates and touches memory until something gives."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.memory_limit
import torch

_hoard = []


def kernel(x, weight):
    while True:
        _hoard.append(torch.ones(1 << 28, dtype=torch.uint8))  # 256 MiB, written
