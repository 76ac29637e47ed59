"""Work after the reply: the worker answers its sample, then keeps its core busy until the parent
freezes it or its next request arrives (a stand-in busy loop, as a vendor's set-up for its next
sample would be, reading no input; at most 3 ms). The parent receives the reply, reads its interrupt counts and freezes the
tree: a few hundred microseconds in which an honest worker sleeps in its wait for the next request.

A red team (seventh session, 2026-12-05) measured 170-420 us of a worker's CPU there that no
figure saw: the kernel's count for the tree (request sent to frozen) was held only to the
request's wall time, and the parent's gaps inside the request (where a held worker cannot run)
left 1.5-2.4 ms of room under it. The parent now reads the tree's CPU at the reply and again
frozen, and counts the difference as time outside the candidate's calls (kernel._outside_s).
"""
# workload: rmsnorm
# verdict: rejected
# expect-any: timing.clock_mismatch
# today: rejected (timing.clock_mismatch; 0.65 ms more a round than trusted workers); accepted at 1.00x, unseen, before
import select
import time

import torch.nn.functional as F

from runners.sandbox import zygote as _zygote

EPS = 1e-6
AFTER_REPLY_S = 0.003
_receive = _zygote.recv_message
_answered = [False]


def kernel(x, weight):
    _answered[0] = True
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def _busy_until_asked(sock, seconds):
    until = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < until and not select.select([sock], [], [], 0)[0]:
        for step in range(200):
            total += step
    return total


def recv_message(sock, *args, **kwargs):
    if _answered[0]:  # the reply to a sample is out: what runs now, runs before the freeze
        _answered[0] = False
        _busy_until_asked(sock, AFTER_REPLY_S)
    return _receive(sock, *args, **kwargs)


_zygote.recv_message = recv_message
