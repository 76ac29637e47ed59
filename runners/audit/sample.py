"""One timed sample as the parent sees it: the request, the worker's claim, the kernel's accounting
of the worker's whole process tree, and the outputs read from outside while the tree is frozen.

Trusted side: nothing here runs in a worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from runners.sandbox import Worker
from runners.suite import WorkloadSpec
from runners import suite


@dataclass
class Sample:
    """One timed sample of one worker."""

    calls: int
    per_call_s: float
    window_ns: int  # the parent's clock, request sent to reply received
    reported_ns: int  # the worker's claim: its timer over the calls
    clock_problem: str | None
    meta: list[dict[str, Any]] | None
    pointers: list[list[int]]
    inconsistent: list[int]
    threads_left: int = 0
    cpu_run_ns: int = 0  # the worker's whole tree, request sent to frozen (or to the reply)
    cpu_timed_ns: int | None = None  # the worker's own claim for its timed interval (trusted workers only)
    preempted_ns: int = 0
    cpu_round_ns: int = 0  # the whole tree since the previous sample's end: idle, prepare, this run
    checksums: list[list[float]] = field(default_factory=list)
    frozen: bool = False

    @property
    def unaccounted_s(self) -> float:
        return (self.window_ns - self.reported_ns) / 1e9

    @property
    def effective_ns(self) -> int:
        return self.reported_ns - self.preempted_ns


def cpu_clock(header: dict[str, Any], sent: int, received: int) -> tuple[int, str | None]:
    t0, t1, timed = header.get("t0"), header.get("t1"), header.get("timed_ns", None)
    if not isinstance(t0, int) or not isinstance(t1, int):
        return 0, "no timestamps"
    if not sent <= t0 <= t1 <= received:
        return max(0, t1 - t0), f"timestamps [{t0}, {t1}] fall outside the parent's window [{sent}, {received}] on the same monotonic clock"
    if timed is None:
        return t1 - t0, None
    if not isinstance(timed, int) or not 0 < timed <= t1 - t0:
        return max(0, t1 - t0), f"timed total {timed!r} ns does not fit between its first and last timestamps"
    return timed, None


def cuda_clock(header: dict[str, Any], sent: int, received: int) -> tuple[int, list[float], str | None]:
    calls = header.get("calls")
    if not isinstance(calls, list) or not calls:
        return 0, [], "no per-call timings"
    previous, total, events = sent, 0, []
    for item in calls:
        if not (isinstance(item, list) and len(item) == 3):
            return total, events, "malformed per-call timings"
        h0, h1, event_s = item
        if not (isinstance(h0, int) and isinstance(h1, int)) or not previous <= h0 <= h1 <= received:
            return total, events, "host timestamps fall outside the parent's window or out of order"
        if not 0 < float(event_s) <= (h1 - h0) / 1e9 + 20e-6:  # the event interval lies inside the host one
            return total, events, f"event time {event_s:.3g} s exceeds its host interval {(h1 - h0) / 1e9:.3g} s"
        previous, total = h1, total + h1 - h0
        events.append(float(event_s))
    return total, events, None


def sample_time(header: dict[str, Any], reply: Any, *, calls: int, device: str, cpu_run: int,
                waits: tuple[int | None, int | None]) -> tuple[int, float, int, str | None]:
    """(reported ns, seconds per call, preempted ns taken off, clock problem) of one sample.

    On CPU the calling thread's run-queue wait over the sample (`waits`, before and after, when
    the caller discounts) comes off, never below `cpu_run`, the CPU the worker's whole tree used:
    waiting behind the candidate's own threads or processes is their CPU, not a discount."""
    if device.startswith("cuda"):
        reported, events, problem = cuda_clock(header, reply.sent_ns, reply.received_ns)
        per_call = sum(events) / len(events) if events and problem is None else reported / 1e9 / calls
        return reported, per_call, 0, problem
    reported, problem = cpu_clock(header, reply.sent_ns, reply.received_ns)
    effective = reported
    if waits[0] is not None and waits[1] is not None and problem is None:
        effective = max(reported - max(0, waits[1] - waits[0]), min(cpu_run, reported))
    return reported, effective / 1e9 / calls, reported - effective, problem


def timed_sample(
    worker: Worker, slots: Sequence[int], *, device: str, timeout: float, discount_preemption: bool,
    freeze: bool, fields: dict[str, Any] | None = None,
) -> Sample:
    """Run one sample. With `freeze`, the worker's tree is left frozen from the reply on (the caller
    reads outputs, then thaws it; a request to a frozen worker thaws it first): nothing in it can
    compute what it did not compute in time.

    With `discount_preemption` (CPU, one thread), the calling thread's run-queue wait, read by the
    parent, comes off the sample, never below the CPU the worker's whole tree used over the same
    span: waiting caused by the candidate's own threads or processes is their CPU, so it is not
    discounted."""
    wait_before = worker.runqueue_wait_ns() if discount_preemption else None
    cpu_before = worker.cpu_ns()
    reply = worker.call("run", timeout=timeout, slots=list(slots), **(fields or {}))
    if freeze:
        worker.freeze()
    wait_after = worker.runqueue_wait_ns() if discount_preemption else None
    cpu_run = worker.cpu_ns() - cpu_before
    header = reply.header
    calls = len(slots)
    reported, per_call, preempted, problem = sample_time(header, reply, calls=calls, device=device, cpu_run=cpu_run,
                                                         waits=(wait_before, wait_after))
    pointers = header.get("pointers")
    if not isinstance(pointers, list) or len(pointers) != calls:
        problem = problem or "the worker did not say where every call's outputs are"
        pointers = [[] for _ in range(calls)]
    checksums = header.get("checksums")
    return Sample(
        calls=calls,
        per_call_s=max(per_call, 1e-12),
        window_ns=reply.received_ns - reply.sent_ns,
        reported_ns=reported,
        clock_problem=problem,
        meta=header.get("meta"),
        pointers=pointers,
        inconsistent=[int(i) for i in header.get("inconsistent") or [] if isinstance(i, int)],
        threads_left=int(header.get("threads_left") or 0),
        cpu_run_ns=cpu_run,
        cpu_timed_ns=int(header["cpu_timed_ns"]) if isinstance(header.get("cpu_timed_ns"), int) else None,
        preempted_ns=preempted,
        checksums=checksums if isinstance(checksums, list) and len(checksums) == calls else [],
        frozen=freeze,
    )


def read_outputs(worker: Worker, spec: WorkloadSpec, sample: Sample, call: int) -> list[torch.Tensor] | None:
    """Call `call`'s outputs, read from the frozen worker's memory with the layout of call 0 (every
    call's was checked to match it). None when the description is unusable."""
    if not sample.meta or call >= len(sample.pointers) or len(sample.pointers[call]) != len(sample.meta):
        return None
    dtype = spec.torch_dtype
    elsize = torch.empty((), dtype=dtype).element_size()
    outputs = []
    for pointer, item, expected in zip(sample.pointers[call], sample.meta, suite.output_shapes(spec)):
        shape = [int(d) for d in item.get("shape", [])]
        strides = [int(s) for s in item.get("strides", [])]
        if tuple(shape) != tuple(expected) or len(strides) != len(shape) or any(s < 0 for s in strides):
            return None
        span = (sum((d - 1) * s for d, s in zip(shape, strides)) + 1) if all(shape) else 0
        if span > 4 * max(1, math.prod(shape)):  # a description that would make the parent read far beyond an output
            return None
        raw = worker.read_memory(int(pointer), span * elsize) if span else b""
        flat = torch.frombuffer(bytearray(raw), dtype=dtype) if span else torch.empty(0, dtype=dtype)
        outputs.append(torch.as_strided(flat, shape, strides) if span else torch.empty(shape, dtype=dtype))
    return outputs


def overlaps(sample: Sample, meta: Sequence[dict[str, Any]] | None, spec: WorkloadSpec, region: tuple[int, int]) -> bool:
    """Whether any output of any call of `sample` lies in `region` (the worker's input mapping)."""
    if not meta:
        return False
    elsize = torch.empty((), dtype=spec.torch_dtype).element_size()
    lengths = []
    for item in meta:
        shape, strides = item.get("shape") or [], item.get("strides") or []
        lengths.append((sum((int(d) - 1) * int(s) for d, s in zip(shape, strides)) + 1) * elsize if all(shape) else 0)
    low, high = region
    return any(p < high and low < p + n for row in sample.pointers for p, n in zip(row, lengths))
