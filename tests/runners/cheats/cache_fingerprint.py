"""Caches outputs by a cheap content fingerprint (a few sampled elements)."""
# workload: gemm
# verdict: rejected
# expect-any: timing.caching_suspected | correctness.timed_output_mismatch
import torch

_cache = {}


def kernel(a, b):
    key = (tuple(a.shape), float(a.view(-1)[::97].sum()), float(b.view(-1)[::89].sum()))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    out = torch.matmul(a, b)
    _cache[key] = out
    return out
