"""Right on odd calls, zeros on even ones: only a run-twice check sees it on one input set."""
# workload: softmax
# verdict: rejected
# expect: correctness.nondeterministic
import torch

_calls = 0


def kernel(x):
    global _calls
    _calls += 1
    return torch.softmax(x, dim=-1) if _calls % 2 else torch.zeros_like(x)
