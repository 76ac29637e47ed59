"""Reads the values the arm measured before it left in the shared input file, and computes its own
calls before its sample.

Every arm of a round is timed on the same values, and the file used to be cleared only when the
next sample began; a worker was thawed as soon as its own sample was verified. A one-shot SIGALRM
in the idle candidate, scheduled from the control page's counter (one number per call), landed
just after another arm's sample ended; if the slots held a round it had not seen, it computed the
first K of them in batched ops during the parent's settling pause, and its timed calls whose
inputs matched a byte fingerprint returned the precomputed outputs: 1.58x on the parent's clock in
the rounds where it was not first; the CPU-while-others-were-measured figure (0.49 ms against 0.50
allowed in one run) was all that held it. Every arm is now frozen from the end of its sample until
its next request, and the file is cleared before that request thaws it: the timer fires inside
its own sample and nothing of the round is left to read.
"""
# workload: rope
# verdict: error
# expect: sandbox.candidate_exception
# today: accepted 1.04x [0.61, 1.68] (a noisy box, not billable) before arms stayed frozen; 0.99-1.01x, lower bounds 0.94-0.95, after (2026-12-05); since 2026-12-05 the seccomp filter refuses interval timers, so arming one raises

import ctypes
import signal
import time

import torch
import torch.nn.functional as F

from runners.audit import worker as _w

EPS = 1e-6
K = 20  # slots precomputed per round
CHUNK = 8
STATS = False

_st = {"worker": None, "calls": 0, "own_end": None, "seen": None, "memo": {}, "busy": False, "keep": None,
       "hits": 0, "pre": 0, "dur": 0.008, "ticks": 0, "tcpu": 0, "bufs": [None, None], "flip": 0}


def _fp(q, k, cos, sin):
    qs = q.data_ptr()
    return (ctypes.string_at(qs, 16) + ctypes.string_at(qs + q.numel() * 4 - 16, 16)
            + ctypes.string_at(k.data_ptr(), 16) + ctypes.string_at(cos.data_ptr(), 16) + ctypes.string_at(sin.data_ptr(), 16))


def _rot(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def kernel(q, k, cos, sin):
    memo = _st["memo"]
    if memo:
        hit = memo.get(q.data_ptr())
        if hit is not None and hit[0] == _fp(q, k, cos, sin):
            _st["hits"] += 1
            return hit[1]
    return q * cos + _rot(q) * sin, k * cos + _rot(k) * sin


def _stacked(self, start, stop):
    """Each input of slots start..stop-1 as one [n, ...] strided view over the mapping (no copy)."""
    n = stop - start
    out = []
    for index, view in enumerate(self.views[start]):
        step = self.layout.strides[index] // view.element_size()
        out.append(torch.as_strided(view, (n, *view.shape), (step, *view.stride()), view.storage_offset()))
    return out


def _arm(delay):
    signal.setitimer(signal.ITIMER_REAL, max(delay, 0.0002))


def _precompute():
    """Returns the delay to the next check (None: no more checks until the next own sample)."""
    self = _st["worker"]
    n, dur, own = _st["calls"], _st["dur"], _st["own_end"]
    if self is None or n < 2 or self.counter is None or own is None:
        return None
    c = self.counter.value
    rel = (c - own) % n
    if c == own:
        return 0.002 + dur * 0.5  # no other sample yet
    if rel:
        return (n - rel) * dur / n + 0.0005  # mid-sample: check again just after it ends
    views = self.views
    if len(views) < n:
        return None
    last = _fp(*views[n - 1])
    if last.count(0) == len(last):
        return dur * 0.5  # cleared: the next sample is starting
    first = _fp(*views[0])
    if first == _st["seen"]:
        return 0.002 + dur * 0.6  # this round's values, used already: wait for the next sample
    _st["seen"] = first
    k = min(K, n)
    memo = {}
    for a in range(0, k, CHUNK):
        b = min(k, a + CHUNK)
        before = [_fp(*views[s]) for s in range(a, b)]
        q, kk, cos, sin = _stacked(self, a, b)
        cos, sin = cos[:, None, None], sin[:, None, None]
        qo, ko = q * cos + _rot(q) * sin, kk * cos + _rot(kk) * sin
        for j, s in enumerate(range(a, b)):
            f = before[j]
            if f.count(0) != len(f) and _fp(*views[s]) == f:
                memo[views[s][0].data_ptr()] = (f, (qo[j], ko[j]))
        if self.counter.value != c or ctypes.string_at(views[0][0].data_ptr(), 16).count(0) == 16:
            break  # the next sample has begun (hide() zeroes the slots first): stop at once
    _st["memo"] = memo
    _st["pre"] += 1
    return None


def _tick(signum, frame):
    if _st["busy"]:
        return
    _st["busy"] = True
    _st["ticks"] += 1
    c0 = time.process_time_ns()
    delay = None
    try:
        delay = _precompute()
    finally:
        _st["busy"] = False
    if delay is not None:
        _arm(delay)
    _st["tcpu"] += time.process_time_ns() - c0


signal.signal(signal.SIGALRM, _tick)
_orig_run = _w.KernelWorker.op_run


def _run(self, header):
    signal.setitimer(signal.ITIMER_REAL, 0)
    _st["worker"] = self
    t0 = time.perf_counter()
    try:
        reply = _orig_run(self, header)
    finally:
        slots = header.get("slots") or []
        base = header.get("step_base")
        if base is not None and len(slots) > 12 and slots[:2] == [0, 1]:
            _st["calls"] = len(slots)
            _st["own_end"] = int(base) + len(slots)
            _st["dur"] = min(0.05, max(0.002, time.perf_counter() - t0))
            if self.views:
                _st["seen"] = _fp(*self.views[0])
        if STATS:
            with open("rt_stats.txt", "a") as f:
                f.write("calls=%d hits=%d ticks=%d tcpu_us=%d pre=%d dur_ms=%.1f\n" % (
                    len(slots), _st["hits"], _st["ticks"], _st["tcpu"] // 1000, _st["pre"], _st["dur"] * 1e3))
        _st["hits"] = _st["ticks"] = _st["tcpu"] = 0
        _st["memo"] = {}
        _arm(0.002 + _st["dur"])
    return reply


_w.KernelWorker.op_run = _run

_orig_describe = _w.describe


def _describe(results, *, expect_tuple):
    """Call 0 described by the harness, then one pointer per call."""
    head = _orig_describe(results[:1], expect_tuple=expect_tuple)
    ptr = torch.Tensor.data_ptr
    head["pointers"] = [[ptr(a), ptr(b)] for a, b in results]
    return head


_w.describe = _describe
