"""Correct, but leaves a double-forked daemon process running (it could work between windows)."""
# workload: rmsnorm
# verdict: rejected
# expect: integrity.stray_process
import os
import time

import torch.nn.functional as F

if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        while True:
            time.sleep(1)
    os._exit(0)
os.wait()


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
