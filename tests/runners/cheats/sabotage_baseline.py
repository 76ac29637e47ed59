"""Patches torch in its own process so the eager op sleeps, hoping the baseline shares the process.
It must not matter: the baseline is timed in a separate trusted worker."""
# probe: sabotage
import time

import torch.nn.functional as F

_honest = F.rms_norm


def _slow(*args, **kwargs):
    time.sleep(0.05)
    return _honest(*args, **kwargs)


F.rms_norm = _slow


def kernel(x, weight):
    return _honest(x, (x.shape[-1],), weight, 1e-6)
