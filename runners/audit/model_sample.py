"""One timed sample of a whole-model worker, as the parent measures it. Trusted side.

A sample is stepped: the parent reveals one call's inputs per request (`step`) and the worker's
reply must carry its commitment to that call's outputs (runners.audit.model_inputs.row_commitments)
before the next call's inputs exist anywhere it can read. The time billed is the parent's own
clock, request sent to reply received, summed over the calls: nothing the worker says about its
time enters the figure. So a worker cannot batch calls it has not seen (lookahead), answer early
and finish later (the commitment needs the outputs), or move work outside a clock it cannot touch.

The wire round trip is inside every call's window, the same for every arm: it can only pull a
speedup towards 1, so it is kept small. The commitment travels as the reply's one raw float32
tensor, not as JSON numbers: at batch 2 x seq 512 (1,024 rows) writing and reading them as JSON
took about 0.56 ms a call, and each call's window ran 1.4-1.6 ms beyond the worker's forward
(measured with the Llama sample, 2026-12-06).
Every worker polls for a sample's next step rather than sleeping in recv
(runners.sandbox.zygote.await_request), so its wake-up is not a lever a candidate's worker holds
alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from runners.audit.sample import fence_for, spare_cores
from runners.sandbox import Worker
from runners.sandbox.procfs import core_interrupts


@dataclass
class ModelSample:
    """One worker's timed calls of one round."""

    calls: int
    per_call_s: float  # the parent's windows, summed, less the discounted wait, per call
    window_ns: int  # the parent's clock over the calls' requests
    preempted_ns: int  # run-queue wait of the worker's thread taken off (CPU, one thread)
    cpu_run_ns: int  # the kernel's count for the worker's whole tree over the sample
    clock_problem: str | None  # the worker's timestamps do not fit the parent's windows (a lie, judged)
    checksums: list[list[float]]
    metas: list[Any]  # each call's outputs, described (checks.inspect_outputs), as the worker said
    windows_ns: list[int] = field(default_factory=list)
    unbilled_ns: int = 0  # the windows of calls before the first billed one (decode: call 0)
    # Interrupts on the worker's measurement cores from the first billed call's request to the
    # last reply, and that span (procfs.core_interrupts); None where /proc/interrupts is unreadable.
    interrupts: int | None = None
    interrupts_ns: int = 0
    held: bool = False  # the parent held the worker's core between calls (sample.CoreFence): no discount taken
    # Frozen samples: the tree's CPU from the last reply received until it was frozen, outside every
    # window (runners.modelaudit moves it from the window's CPU to the idle CPU the audit judges).
    after_reply_ns: int = 0

    @property
    def interrupts_per_ms(self) -> float | None:
        if self.interrupts is None or self.interrupts_ns <= 0:
            return None
        return self.interrupts / (self.interrupts_ns / 1e6)


def _commitment(tensor: torch.Tensor | None) -> list[float]:
    """A call's committed row checksums (runners.audit.model_inputs.row_commitments) as floats;
    anything but one floating vector is no commitment (the check then fails the call)."""
    if tensor is None or tensor.dim() != 1 or not tensor.dtype.is_floating_point:
        return []
    return tensor.double().tolist()


def stepped_sample(worker: Worker, items: Sequence[list[int]], *, timeout: float, discount: bool,
                   bill_from: int = 0, freeze: bool = False) -> ModelSample:
    """Time `items` (what each call reads, runners.modelaudit._reveal) one request per call.

    Calls before `bill_from` are timed and kept (`unbilled_ns`) but not billed, and the discount
    and the tree's CPU are read from the end of the last of them: decode bills from its second
    call, whose input (the first call's token on the prompt's cache, then its own) exists nowhere
    before its window, where the first call's could have been tabulated from the prompt.
    With `discount` (CPU, one thread per worker) the worker's run-queue wait over the billed calls
    comes off, never below the CPU its whole tree used over the same span: waiting behind its own
    threads or processes is their CPU, not other processes' time.

    With `freeze` the worker's tree is frozen after the last reply, before its CPU and its main
    thread's wait are read: the kernel books a running thread's CPU at its next tick or switch, so
    a tree still running at the read is up to a tick (4 ms at 250 Hz) short. A red team replied
    from a helper thread that computed every call and ran on past the reply, its main thread
    SCHED_IDLE so that the whole forward was booked as run-queue wait: the stale floor let the wait
    come off, and decode and prefill of an unmodified model billed at 1.26-1.44x (2026-12-05).
    Frozen, every nanosecond the tree ran since the first billed call is booked, including what it
    ran after the reply. The discount is only taken from a frozen worker. What it ran from the last
    reply to the freeze is `after_reply_ns`: no call's time, judged with the CPU of an idle worker
    (as kernel audits count it since red team 11 found 170-420 us a sample there, unseen).

    Where the parent can hold the worker's only measurement core (sample.CoreFence: one core,
    SCHED_FIFO), it does so for the whole sample: the parent sleeps in its wait for each reply, the
    reply wakes it and it preempts the worker at once, so nothing of the worker runs between a
    reply and the next request. Unheld, the worker polled on for the next request (~30-70 us a
    call on the development VM) and a red team built the next forward's constants there
    (2026-12-05, sixth session). Held, the worker's run-queue wait holds the gaps the parent took,
    so no discount is taken."""
    spare = spare_cores(worker)
    fence = fence_for(worker, spare)
    cores = list(worker.sandbox.config.cpus)
    pinned = os.sched_getaffinity(0)
    if spare:
        os.sched_setaffinity(0, spare)  # the parent's wake-ups never land on the measured core
    windows: list[int] = []
    committed: list[torch.Tensor | None] = []  # each call's reply tensor, read into floats after the sample
    metas: list[Any] = []
    problem: str | None = None
    held = False
    try:
        if fence is not None and worker.frozen:
            worker.thaw()  # before the fence: nothing of a held worker could run to finish a thaw
        held = fence is not None and fence.enter()
        discount = discount and not held
        bill_from = min(bill_from, max(len(items) - 1, 0))
        wait_before, cpu_before = None, 0
        interrupts_before: int | None = None
        billed_from_ns = last_ns = 0
        # Each call's ids as raw int64 bytes, built before any window (as JSON numbers, 1,025 ids
        # were about 0.16 ms of writing, reading and converting inside each window).
        requests = [torch.tensor(list(item), dtype=torch.int64) for item in items]
        for call, item in enumerate(requests):
            if call == bill_from:  # the discount, the tree's CPU and interrupts count from the first billed call
                wait_before = worker.runqueue_wait_ns() if discount else None
                cpu_before = worker.cpu_ns()
                interrupts_before = core_interrupts(cores)
            reply = worker.call("step", timeout=timeout, call=call, tensors=[item])
            windows.append(reply.received_ns - reply.sent_ns)
            if call == bill_from:
                billed_from_ns = reply.sent_ns
            last_ns = reply.received_ns
            header = reply.header
            t0, t1 = header.get("t0"), header.get("t1")
            if problem is None and not (isinstance(t0, int) and isinstance(t1, int) and reply.sent_ns <= t0 <= t1 <= reply.received_ns):
                problem = (f"call {call}: the worker's timestamps {t0!r}..{t1!r} fall outside the parent's window "
                           f"[{reply.sent_ns}, {reply.received_ns}] on the same monotonic clock")
            committed.append(reply.tensors[0] if len(reply.tensors) == 1 else None)
            metas.append(header.get("meta"))
        # Read at once: held, the worker was preempted when the reply woke the parent, so its CPU
        # is booked to the reply; whatever it runs from here to the freeze is not a call's.
        cpu_at_reply = worker.cpu_ns() if freeze else None
        interrupts_after = core_interrupts(cores) if interrupts_before is not None else None
        if held and fence is not None:
            fence.leave()  # before the freeze: a held worker could not reach the freezer
        if freeze:
            worker.freeze()  # until its next request (the round's checks) thaws it
        wait_after = worker.runqueue_wait_ns() if discount and freeze else None
        cpu_end = worker.cpu_ns()
        cpu_run = cpu_end - cpu_before
        after_reply = max(0, cpu_end - cpu_at_reply) if cpu_at_reply is not None else 0
    except BaseException:
        if held and fence is not None:
            fence.leave()
        raise
    finally:
        if spare:
            os.sched_setaffinity(0, pinned)
    unbilled, windows_billed = sum(windows[:bill_from]), windows[bill_from:]
    total = sum(windows_billed)
    effective = total
    if wait_before is not None and wait_after is not None:
        effective = max(total - max(0, wait_after - wait_before), min(cpu_run, total))
    calls = len(items)
    billed_calls = len(windows_billed)
    return ModelSample(
        calls=calls,
        per_call_s=max(effective / 1e9 / max(billed_calls, 1), 1e-12),
        window_ns=total,
        preempted_ns=total - effective,
        cpu_run_ns=cpu_run,
        clock_problem=problem,
        checksums=[_commitment(tensor) for tensor in committed],
        metas=metas,
        windows_ns=windows,
        unbilled_ns=unbilled,
        interrupts=interrupts_after - interrupts_before if interrupts_before is not None and interrupts_after is not None else None,
        interrupts_ns=last_ns - billed_from_ns,
        held=held,
        after_reply_ns=after_reply,
    )
