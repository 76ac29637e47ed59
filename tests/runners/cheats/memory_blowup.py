"""Allocates memory until something gives: a gigabyte at a time, so it reaches the limit at once
even on a loaded machine (writing every page would race the call timeout instead)."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.memory_limit
import torch

_hoard = []


def kernel(x, weight):
    while True:
        _hoard.append(torch.empty(1 << 30, dtype=torch.uint8))
        _hoard[-1][:: 1 << 12].fill_(1)  # one byte per page: resident, not just reserved
