"""Returns an output buffer at once and fills it from a thread after the call returned."""
# workload: rmsnorm
# verdict: rejected
# expect: integrity.thread_left_running
import threading
import time

import torch
import torch.nn.functional as F


def kernel(x, weight):
    out = torch.empty_like(x)

    def fill():
        time.sleep(0.02)
        out.copy_(F.rms_norm(x, (x.shape[-1],), weight, 1e-6))

    threading.Thread(target=fill, daemon=True).start()
    return out
