"""Caches outputs by input pointers: a repeat call with the same buffers skips the work."""
# workload: gemm
# verdict: rejected
# expect-any: timing.caching_suspected | correctness.timed_output_mismatch
import torch

_cache = {}


def kernel(a, b):
    key = (a.data_ptr(), b.data_ptr(), tuple(a.shape), tuple(b.shape))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    out = torch.matmul(a, b)
    _cache[key] = out
    return out
