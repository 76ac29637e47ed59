"""One timed sample as the parent sees it: the request, the worker's claim, the kernel's accounting
of the worker's whole process tree, and the outputs read from outside while the tree is frozen.

Trusted side: nothing here runs in a worker.
"""

from __future__ import annotations

import errno
import math
import os
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import torch

from runners.audit import futex
from runners.audit.inputs import DoneRecord, DoneRecordBroken, SharedInputs
from runners.sandbox import SandboxError, Worker
from runners.sandbox.procfs import core_interrupts
from runners.suite import WorkloadSpec
from runners import suite


@dataclass
class Sample:
    """One timed sample of one worker."""

    calls: int
    per_call_s: float
    window_ns: int  # the parent's clock: request sent to reply received (stepped: the calls' windows, summed)
    reported_ns: int  # the worker's timer over the calls; stepped: the parent's windows over every call (per_call_s is what bills)
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
    stepped: bool = False  # calls revealed one at a time (CPU with a core to spare for the parent)
    fenced: bool = False  # stepped, the parent holding the worker's core outside every call's window (CoreFence)
    snapshots: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # call -> (address, bytes) read when it said done
    snapshot_stalls: int = 0  # of those reads, how many waited on the worker (its memory-map lock)
    interrupts: int | None = None  # on the measurement cores (procfs.core_interrupts): stepped, from call 0 seen done to the reply
    interrupts_ns: int = 0  # the span they were counted over
    request_ns: int = 0  # the parent's clock, request sent to reply received
    gaps_ns: int = 0  # stepped: between a call seen done and the next announced, and after the last (the parent's copies and snapshots)
    call_windows: list[int] = field(default_factory=list)  # stepped: each call's window on the parent's clock
    ready_ns: int = 0  # stepped: from the request sent to the worker's "ready" for call 0 (its reading of the request)
    after_reply_ns: int = 0  # stepped and frozen: the tree's CPU from the reply received to the freeze
    meanwhile_s: float = 0.0  # CPU of the tree while other arms of the round were measured (runners.audit.rounds)
    order: tuple[str, ...] = ()  # the round's arms in the order they were measured

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


class _Steps:
    """What the parent saw while it revealed a sample's calls one by one."""

    def __init__(self) -> None:
        self.window_ns = 0  # sum over calls: announced to done seen
        self.windows: list[int] = []  # each call's
        self.snapshots: dict[int, list[tuple[int, bytes]]] = {}
        self.gaps_ns = 0
        self.fenced = False  # the parent held the worker's core for the whole sample (CoreFence)
        self.stalls = 0  # snapshot reads during which the parent's thread blocked (see _step_calls)
        self.interrupts_mark: tuple[int, int] | None = None  # (interrupts, perf_counter ns) when call 0 was seen done
        self.sent_ns = 0  # the request sent (perf_counter ns)
        self.ready_ns = 0  # from the request sent to the worker's "ready" (it has read the request and waits for call 0)
        self.problem: str | None = None


def spare_cores(worker: Worker) -> list[int]:
    """The cores the parent may use while a worker is measured: its own, not the measurement cores."""
    measured = set(worker.sandbox.config.cpus)
    return sorted(set(os.sched_getaffinity(0)) - measured) if measured else []


class CoreFence:
    """The parent takes the worker's only measurement core for a stepped sample.

    A real-time thread (SCHED_FIFO) moved onto a core preempts every ordinary thread there at
    once, and the worker's tree may run on no other core (its cpuset): while the parent runs
    there nothing of the worker runs. The parent stays on the core from before call 0 to after the
    last call is seen done and runs whenever it is awake: it copies a call's values, announces it
    and sleeps (the worker's window), and the worker's wake after its done record hands the core
    back at once (a real-time thread woken on its own core preempts the waker). So no worker can
    watch values land before its call is announced, and none runs between a call's done record
    and the next announcement. Needs one measurement core and the right to use SCHED_FIFO (root
    or CAP_SYS_NICE); `enter` says False, and nothing is held, where either is missing.

    Until 2026-12-05 the fence was entered and left around each call's copy: the worker ran on
    its own from its done record until the parent's move onto the core (35-50 us on a VM), and a
    candidate that moved its input-independent per-call work there billed 1.06-1.075x for
    nothing on `cpu-ci` rmsnorm (a red team)."""

    def __init__(self, core: int, home: Sequence[int]) -> None:
        self.core, self.home = core, list(home)

    def enter(self) -> bool:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            return False
        try:
            os.sched_setaffinity(0, [self.core])
        except OSError:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            return False
        return True

    def leave(self) -> None:
        """Back to the parent's own cores (moved while still real-time), then an ordinary thread."""
        try:
            os.sched_setaffinity(0, self.home)
        finally:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def fence_for(worker: Worker, spare: Sequence[int]) -> CoreFence | None:
    cores = list(worker.sandbox.config.cpus)
    return CoreFence(cores[0], spare) if len(cores) == 1 and spare and futex.available() else None


def _step(worker: Worker, inputs: SharedInputs, slots: Sequence[int], *, request: Callable[[], int], base: int,
          done: DoneRecord, snapshot: Collection[int], spans: Sequence[tuple[int, int]], op: str, deadline: float,
          timeout: float, fence: CoreFence | None = None, cores: Sequence[int] = ()) -> _Steps:
    """Reveal call i's values, announce it, wait for the worker to say it is done; read the outputs
    of the calls in `snapshot` (drawn secretly by the caller) at that moment, before the next call's
    values exist anywhere the worker can read, in a secret order of chunks (a worker finishing the
    end of an output after its report cannot stay ahead of a front-to-back read). A worker that says "done" early, to get the next
    inputs and compute several calls at once, is caught by a snapshot that does not hold the
    outputs it later reports."""
    steps = _Steps()
    try:
        _step_calls(steps, worker, inputs, slots, request=request, base=base, done=done, snapshot=snapshot,
                    spans=spans, op=op, deadline=deadline, timeout=timeout, fence=fence, cores=cores)
    except DoneRecordBroken as exc:
        steps.problem = f"{exc}: its calls cannot be followed"
    return steps


def _step_calls(steps: _Steps, worker: Worker, inputs: SharedInputs, slots: Sequence[int], *, request: Callable[[], int],
                base: int, done: DoneRecord, snapshot: Collection[int], spans: Sequence[tuple[int, int]], op: str,
                deadline: float, timeout: float, fence: CoreFence | None = None, cores: Sequence[int] = ()) -> None:
    clock = time.perf_counter_ns
    seen = 0
    # Held (the fence entered once for the whole sample): the parent runs on the worker's core
    # at real-time priority except while it sleeps inside a call's window, so the worker runs
    # only inside windows. It copies a call's values, announces it and sleeps; the worker wakes it
    # right after writing the done record, and the wake hands the core straight back to the
    # parent. Nothing of the worker runs between one call's done record and the next call's
    # announcement: work a candidate moved there (allocating outputs, unpacking arguments) now
    # runs inside a window. Spun at a distance (no fence), that gap was the worker's, unbilled.
    # The request goes out once the parent holds the core (the worker's wake-up is then a local
    # one, not an idle core's), and call 0 is announced only after the worker's "ready" (the
    # record names `base`): its reading of the request lies outside every window, and every call,
    # call 0 included, bills. Work a worker does before "ready" is time outside its windows, held
    # to the trusted workers' (kernel._judge_cpu, `_outside_s`).
    held = fence is not None and fence.enter()
    steps.fenced = held
    try:
        steps.sent_ns = request()
        wait = _sleep_until_record if held else _spin_until_record
        if not wait(worker, inputs, done, base, op=op, deadline=deadline, timeout=timeout):
            steps.problem = "the worker answered before it was ready for call 1"
            return
        steps.ready_ns = clock() - steps.sent_ns
        if held and snapshot:
            # Held, the worker cannot run while its last call's outputs are read (it would be
            # replying otherwise): read them too, or work deferred past the last "done" would
            # only be held to the hidden-work allowance.
            snapshot = {*snapshot, len(slots) - 1}
        for index, slot in enumerate(slots):
            number = base + index + 1
            inputs.reveal(slot)
            announced = clock()  # before the store: the worker's call may start the moment it lands
            inputs.announce(number)
            if index:
                steps.gaps_ns += announced - seen
            if not wait(worker, inputs, done, number, op=op, deadline=deadline, timeout=timeout):
                steps.problem = f"the worker answered before call {index + 1} of {len(slots)} was done"
                return
            seen = clock()
            steps.window_ns += seen - announced
            steps.windows.append(seen - announced)
            if index in snapshot:
                # The record's byte counts are the worker's word: a count below the whole output's
                # would make the snapshot a check of the few bytes the worker chose. Such a record
                # gets no snapshot, which fails the sample; the exact count is checked again against
                # the layout the worker later describes (KernelAudit._snapshots_hold).
                # A read of another process's memory takes its memory-map lock; a worker can hold that
                # lock for writing (a second thread in a long mprotect) so the read waits until the
                # output it reported done is finished. An uncontended read never blocks: the parent's
                # thread going to sleep during it (a voluntary context switch) marks the snapshot stalled.
                blocked = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
                taken = []
                for (address, span), (least, most) in zip(done.outputs(), spans):
                    data = worker.peek_scattered(address, span) if address and least <= span <= most else b""
                    taken.append((address, data))
                steps.snapshots[index] = taken
                if resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw != blocked:
                    steps.stalls += 1
            if index == 0 and len(slots) > 1:
                # After any snapshot (read at once, the worker gets no time from this). Interrupts are
                # judged over the calls after the first: call 0 bills nothing, and a candidate that
                # filled it with its own interrupts (a red team: 10 ms of 1 us sleeps) raised its rate
                # enough to hide a storm aimed at the other arms.
                counted = core_interrupts(list(cores))  # the measurement cores, read before the parent pinned itself
                steps.interrupts_mark = (counted, clock()) if counted is not None else None
        # The parent's own work after the last call was seen done (a snapshot of it, where held)
        # is a gap like the others: the worker is not timed for it (kernel._outside_s).
        steps.gaps_ns += clock() - seen
    finally:
        if held and fence is not None:
            fence.leave()


_NAP_S = 0.05  # a held parent's longest sleep in a window before it checks the worker's limits
_NAP_ENDINGS = (0, errno.ETIMEDOUT, errno.EINTR)  # woken, timed out, a signal


def _sleep_until_record(worker: Worker, inputs: SharedInputs, done: DoneRecord, number: int, *, op: str,
                      deadline: float, timeout: float) -> bool:
    """Held: sleep on the counter until the record names `number` (a call done, or the sample's
    base: the worker read the request and is ready); False where the worker replied without it. A worker that never wakes the parent is seen at the next nap's end (its window
    runs on meanwhile); a wake-up without the record costs a read of the record, inside the
    window of the worker that is being measured."""
    while done.number() != number:
        ended = inputs.sleep(_NAP_S)
        if ended not in _NAP_ENDINGS:
            # Never spin here: at real-time priority on the worker's core the worker would not run.
            # (EAGAIN too: only the parent writes the counter, so it cannot differ from what it wrote.)
            raise SandboxError("harness.error", f"the parent cannot sleep on the control page: {os.strerror(ended)}")
        if done.number() == number:
            return True
        if ended != 0:  # the nap ran out (or a signal): a worker that replied or hangs is seen here
            if worker.reply_ready() and done.number() != number:
                return False
            worker.check_limits(op, deadline, timeout)
    return True


def _spin_until_record(worker: Worker, inputs: SharedInputs, done: DoneRecord, number: int, *, op: str, deadline: float,
                       timeout: float) -> bool:
    """Unheld: poll the record until it names `number`, as `_sleep_until_record` sleeps for it."""
    polls = 0
    while done.number() != number:
        polls += 1
        if polls & 4095 == 0:
            # An error, or a reply without every call. The last call's "done" and the reply
            # may both land between the two reads (the parent preempted in between, seen in a
            # loaded CI run): the record is read again before the worker is blamed.
            if worker.reply_ready() and done.number() != number:
                return False
            worker.check_limits(op, deadline, timeout)
    return True


def timed_sample(
    worker: Worker, slots: Sequence[int], *, device: str, timeout: float, discount_preemption: bool,
    freeze: bool, fields: dict[str, Any] | None = None, inputs: SharedInputs | None = None,
    done: DoneRecord | None = None, snapshot: Collection[int] = (), fence: bool = True,
) -> Sample:
    """Run one sample. With `freeze`, the worker's tree is left frozen from the reply on (the caller
    reads outputs, then thaws it; a request to a frozen worker thaws it first): nothing in it can
    compute what it did not compute in time.

    With `inputs` (and the worker's "done" record), on CPU where a core is left for the parent,
    the sample is stepped: the file is cleared, and each call's values are revealed only when the
    previous call is done (see _step); the outputs of `snapshot` calls are read at that moment.
    Otherwise every slot is revealed before the request. `fence=False` copies each call's values
    without the core fence (the caching probe: its identical calls are told apart anyway).

    With `discount_preemption` (CPU, one thread), the calling thread's run-queue wait, read by the
    parent, comes off a whole sample: waiting caused by the candidate's own threads or processes is
    their CPU, so it is not discounted, and the sample never bills below the CPU the worker's whole
    tree used over the same span. Stepped samples take nothing off. They did take the wait read
    around each call, less the CPU of every thread of the tree but the calls thread, which the
    trusted loop's own request thread cancelled in every trusted arm (0 on `cpu-ci`) while a
    candidate whose calls thread took over the request loop kept it: the wait for the parent's
    move back off the fenced core, about 3% of rmsnorm's windows (a red team, 2026-12-05)."""
    spare = spare_cores(worker) if inputs is not None and done is not None and device == "cpu" else []
    stepped = bool(spare)
    if inputs is not None:
        inputs.hide()
        if not stepped:
            for slot in dict.fromkeys(slots):
                inputs.reveal(slot)
    wait_before = worker.runqueue_wait_ns() if discount_preemption and not stepped else None
    cpu_before = worker.cpu_ns()
    cores = list(worker.sandbox.config.cpus)
    # Stepped samples of several calls count interrupts from call 0 seen done (_step_calls).
    interrupts_before = core_interrupts(cores) if not (stepped and len(slots) > 1) else None
    request = dict(fields or {})
    steps: _Steps | None = None
    cpu_at_reply: int | None = None
    if stepped:
        assert inputs is not None and done is not None
        request["step_base"] = base = inputs.reserve(len(slots))
        # Each output's bytes: at least a dense tensor of its shape, at most four times that.
        spans = [(dense, 4 * dense) for dense in dense_bytes(inputs.spec)]
        held = fence_for(worker, spare) if fence else None  # before the parent pins itself: the sandbox's cores derive from its mask
        pinned = os.sched_getaffinity(0)
        os.sched_setaffinity(0, spare)  # the parent spins too: never on a core it measures
        try:
            deadline = time.monotonic() + timeout
            if worker.frozen:
                worker.thaw()  # before the fence: nothing of a held worker could run to finish a thaw
            steps = _step(worker, inputs, slots, request=lambda: worker.send("run", slots=list(slots), **request),
                          base=base, done=done, snapshot=set(snapshot), spans=spans, op="run", deadline=deadline,
                          timeout=timeout, fence=held, cores=cores)
            reply = worker.receive("run", sent_ns=steps.sent_ns, deadline=deadline, timeout=timeout)
            cpu_at_reply = worker.cpu_ns() if freeze else None
        finally:
            os.sched_setaffinity(0, pinned)
    else:
        reply = worker.call("run", timeout=timeout, slots=list(slots), **request)
    interrupts_after = core_interrupts(cores)
    interrupts: tuple[int, int] | None = None  # counted on the measurement cores, over this many ns
    if interrupts_after is not None:
        if steps is not None and steps.interrupts_mark is not None:
            interrupts = (interrupts_after - steps.interrupts_mark[0], reply.received_ns - steps.interrupts_mark[1])
        elif interrupts_before is not None:
            interrupts = (interrupts_after - interrupts_before, reply.received_ns - reply.sent_ns)
    if freeze:
        worker.freeze()
    wait_after = worker.runqueue_wait_ns() if discount_preemption and not stepped else None
    cpu_end = worker.cpu_ns()
    cpu_run = cpu_end - cpu_before
    # What the tree ran after its reply, until frozen (stepped and frozen only): an honest worker
    # waits in recv; a red team (seventh session) found 170-420 us a sample usable there, unseen
    # under the parent's gaps in the request's wall time (kernel._outside_s counts it now).
    after_reply = max(0, cpu_end - cpu_at_reply) if cpu_at_reply is not None else 0
    header = reply.header
    calls = len(slots)
    reported, per_call, preempted, problem = sample_time(header, reply, calls=calls, device=device, cpu_run=cpu_run,
                                                         waits=(wait_before, wait_after))
    window = reply.received_ns - reply.sent_ns
    claimed = reported
    if steps is not None:
        problem = problem or steps.problem
        window = steps.window_ns
        if problem is None and claimed > window:
            problem = f"the worker claims {claimed} ns for its calls, more than the {window} ns between their announcements and their reports"
        # What bills is the parent's own clock around each call (announced to done seen), in
        # every arm alike; the worker's timer is only held to fit inside it. A worker's claim
        # would let a candidate that replaces the harness's loop in its own process report less
        # than it took (a red team billed 1.2-1.6x on rmsnorm that way, under the hidden-work
        # allowance). The windows also hold the loop's own latency (noticing the announcement,
        # writing the done record), the same trusted code in every arm.
        reported = window
        # The time a call bills is the mean window over every call, call 0 included: the worker
        # reads the request before its "ready", outside every window. Until 2026-12-05 (sixth
        # session) call 0's window held that reading (0.4-1 ms on this VM) and did not bill, so
        # a worker could do there, free, the input-independent work of every later call.
        per_call = window / 1e9 / calls
        preempted = 0  # stepped samples take no run-queue wait off (see the docstring)
    pointers = header.get("pointers")
    if not isinstance(pointers, list) or len(pointers) != calls:
        problem = problem or "the worker did not say where every call's outputs are"
        pointers = [[] for _ in range(calls)]
    checksums = header.get("checksums")

    return Sample(
        calls=calls,
        per_call_s=max(per_call, 1e-12),
        window_ns=window,
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
        stepped=stepped,
        fenced=steps.fenced if steps is not None else False,
        snapshots=steps.snapshots if steps is not None else {},
        snapshot_stalls=steps.stalls if steps is not None else 0,
        interrupts=interrupts[0] if interrupts is not None else None,
        interrupts_ns=interrupts[1] if interrupts is not None else 0,
        request_ns=reply.received_ns - reply.sent_ns,
        gaps_ns=steps.gaps_ns if steps is not None else 0,
        call_windows=steps.windows if steps is not None else [],
        ready_ns=steps.ready_ns if steps is not None else 0,
        after_reply_ns=after_reply,
    )


def dense_bytes(spec: WorkloadSpec) -> list[int]:
    """The bytes of each output of `spec` stored densely: the least a snapshot of it may cover."""
    elsize = torch.empty((), dtype=spec.torch_dtype).element_size()
    return [max(1, math.prod(shape)) * elsize for shape in suite.output_shapes(spec)]


def layout_bytes(item: dict[str, Any], elsize: int) -> int:
    """The bytes an output described by `item` (its shape and strides) spans, first element to last."""
    shape, strides = item.get("shape") or [], item.get("strides") or []
    if not all(shape):
        return 0
    return (sum((int(d) - 1) * int(s) for d, s in zip(shape, strides)) + 1) * elsize


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
        span = layout_bytes(item, elsize) // elsize
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
    lengths = [layout_bytes(item, elsize) for item in meta]
    low, high = region
    return any(p < high and low < p + n for row in sample.pointers for p, n in zip(row, lengths))
