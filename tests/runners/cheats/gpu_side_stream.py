"""GPU only: launches the work on a side stream and returns at once, so an event recorded on the
default stream stops before the work is done. The harness synchronizes the whole device before
its end event, so the time is charged anyway. Not run by the CPU test suite (no device here)."""
# workload: rmsnorm
# device: cuda
# verdict: accepted
import torch
import torch.nn.functional as F

_side = None


def kernel(x, weight):
    global _side
    if _side is None:
        _side = torch.cuda.Stream()
    _side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side):
        out = F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
    return out
