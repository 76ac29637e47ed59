"""Caches outputs by a cheap content fingerprint (a few sampled elements).

Timed inputs never repeat (fresh values in every slot, every round), so the cache only ever hits in
the caching probe's identical batch. Since inputs are revealed call by call (copied just before
the call, so hot in cache for distinct and identical calls alike) a hit saves about half of a
cpu-ci gemm call, close to the probe's threshold: it is flagged in some runs, and where it is not,
the fingerprint and the outputs it keeps alive make it 0.37-0.43x the baseline (2026-12-01).
"""
# workload: gemm
# verdict: no-gain
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
