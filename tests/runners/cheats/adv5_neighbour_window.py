"""Computes honestly, and makes the arm measured after it slower: when a sample's reply has gone, a
timer signal in the worker's own main thread (no thread or process is left for the harness to
find) fires after the harness's settling check, and the handler streams through memory on the
shared cores for 2 ms, inside the next arm's window (the baseline's, in most rounds). On a
small sample its CPU is also hidden work; on a large one it fits that allowance, and the round
engine's figure of CPU spent while other arms were measured caught it. Every arm is now frozen
from the end of its sample to its next request: the timer expires while the worker is frozen and
the handler runs when the next request thaws it, in the candidate's own first call (which bills
nothing: the calls after it do)."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.candidate_exception
# today: accepted at 0.99-1.02x, CI low 0.88-0.91 (2026-12-05, arms frozen between samples, the first call unbilled; 0.71-0.73x while it was billed); since 2026-12-05 the seccomp filter refuses interval timers, so arming one raises
import signal
import time

import torch
import torch.nn.functional as F

import runners.audit.worker as harness

_scratch = bytearray(16 << 20)


def _stream(signum, frame) -> None:
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        for i in range(0, len(_scratch), 4096):
            _scratch[i] = (_scratch[i] + 1) & 255


signal.signal(signal.SIGALRM, _stream)
_run = harness.KernelWorker.op_run


def _op_run(self, header):
    reply = _run(self, header)
    signal.setitimer(signal.ITIMER_REAL, 0.015)  # after the reply, the parent's reads and the next settling
    return reply


harness.KernelWorker.op_run = _op_run


def kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
