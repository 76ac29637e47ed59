"""Class 3 (timed inputs are windows into one pool), against the new harness: the inputs are still
windows into one shared mapping (every input's untyped_storage() is the whole file), so the kernel alone, with no
hook on the harness, can find every slot of the sample and batch them.

From a view's storage offset and the mapping's size the candidate recovers the slot layout
(every input of every slot page-aligned at a fixed stride). The first call of a sample computes
SiLU(gate) x up for its slot and every later slot in one op over strided views of the mapping,
and keeps the results; each later call pops its own. Nothing is reused across values: the memo
is dropped whenever the parent writes new values (`prepare`), and a slot seen twice (the probe's
identical batch) recomputes. Every output is computed inside the timer, by the baseline's
arithmetic; only the per-call dispatch is amortised. A sound harness would not hand the candidate
the inputs of calls it has not made yet (one slot mapped per call, or slots revealed call by call).
"""
# workload: rope
# verdict: rejected
# expect-any: correctness.nondeterministic | correctness.all_zero | correctness.mismatch | correctness.timed_output_mismatch | timing.done_before_computed
# today: accepted 2.59x [2.17, 2.88] billable; rerun 2.44x [2.21, 2.70] billable (kernel-only lookahead, no hook)
# since stepped samples (2026-12-01): rejected by the check phase, correctness.nondeterministic and correctness.all_zero: the slots it reads ahead hold no values until their calls are announced
import torch

from runners.audit import worker as _w


def _no_prepare(self, header):
    """The harness lost its separate prepare step (workers stay frozen between samples)."""
    return {}, []


_memo: dict = {}
_original_prepare = _no_prepare


def _page(nbytes):
    return -(-nbytes // 4096) * 4096


def _rot(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def kernel(q, k, cos, sin):
    storage = q.untyped_storage()
    el = q.element_size()
    steps = [_page(t.numel() * el) // el for t in (q, k, cos, sin)]
    if storage.nbytes() < 2 * sum(steps) * el or any(t.untyped_storage().data_ptr() != storage.data_ptr() for t in (k, cos, sin)):
        return q * cos + _rot(q) * sin, k * cos + _rot(k) * sin  # a stand-alone input
    slots = storage.nbytes() // (sum(steps) * el)
    slot = q.storage_offset() // steps[0]  # q is the first input: its slots start at offset 0
    hit = _memo.pop(slot, None)
    if hit is not None:
        return hit
    _memo.clear()
    n = slots - slot
    qb, kb, cb, sb = (torch.as_strided(t, (n, *t.shape), (st, *t.stride()), t.storage_offset())
                      for t, st in zip((q, k, cos, sin), steps))
    cb, sb = cb[:, None, None], sb[:, None, None]
    qo, ko = qb * cb + _rot(qb) * sb, kb * cb + _rot(kb) * sb
    for i in range(1, n):
        _memo[slot + i] = (qo[i], ko[i])
    return qo[0], ko[0]


def _prepare(self, header):
    _memo.clear()  # new values: nothing computed before is valid
    return _original_prepare(self, header)


_run_before_prepare = _w.KernelWorker.op_run


def _run_with_prepare(self, header):
    _prepare(self, header)  # what the old harness's prepare step did, now at the start of the run request
    return _run_before_prepare(self, header)


_w.KernelWorker.op_run = _run_with_prepare
