"""Correct for the first calls (the ones a naive harness checks), then returns cheap garbage."""
# workload: swiglu
# verdict: rejected
# expect-any: correctness.timed_output_mismatch | correctness.revalidation_failed
import torch.nn.functional as F

_calls = 0


def kernel(gate, up):
    global _calls
    _calls += 1
    if _calls <= 40:
        return F.silu(gate) * up
    return gate * up
