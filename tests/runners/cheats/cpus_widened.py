"""Correct, but it widens its own CPU mask to every core, so its threads (four of them) also
compute on the core the harness keeps for itself, beyond the cores it is measured on."""
# workload: gemm
# verdict: rejected
# expect: integrity.cpus_widened
import os

import torch

os.sched_setaffinity(0, range(os.cpu_count() or 1))
torch.set_num_threads(4)


def kernel(a, b):
    return a @ b
