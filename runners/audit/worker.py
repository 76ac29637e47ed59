"""What runs inside a kernel-audit worker, beside the candidate: load, bind inputs, time, describe.

UNTRUSTED side: this code shares its process with candidate code, which can patch any of it. The
parent therefore relies on nothing here but what it can check from outside (the kernel's CPU
accounting of the worker's cgroup, its own clock, and output memory it reads while the worker is
frozen); what this file reports only makes reasons clearer.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import mmap
import os
import sys
import threading
import time
from typing import Any, Callable, Sequence

import torch

from runners import checks, suite
from runners.audit import futex
from runners.audit.inputs import DoneRecord, SlotLayout, map_control, map_inputs
from runners.measure import candidate_fault
from runners.sandbox import WorkerFault
from runners.suite import WorkloadSpec


def describe(results: Sequence[Any], *, expect_tuple: bool) -> dict[str, Any]:
    """Where every call's outputs live (the parent reads them from outside) and whether every call
    returned the same kind of output as call 0. Kept to a few attribute reads per call: this runs
    after the timer stops, in every arm alike, and its cost is what the CPU check allows for."""
    first = results[0] if results else None
    items0, meta = checks.inspect_outputs(first, [], expect_tuple=expect_tuple)
    signature = [(tuple(t.shape), t.stride(), t.dtype, t.device) for t in items0] if items0 is not None else None
    pointers: list[list[int]] = []
    inconsistent: list[int] = []
    for index, result in enumerate(results):
        items = result if expect_tuple and isinstance(result, (tuple, list)) else (result,)
        if signature is None or len(items) != len(signature):
            inconsistent.append(index)
            pointers.append([])
            continue
        row = []
        for item, (shape, stride, dtype, device) in zip(items, signature):
            if type(item) is not torch.Tensor or item.shape != shape or item.stride() != stride or item.dtype != dtype or item.device != device:
                inconsistent.append(index)
                row = []
                break
            row.append(item.data_ptr())
        pointers.append(row)
    if meta is not None and items0 is not None:
        for item, tensor in zip(meta, items0):
            item["strides"] = list(tensor.stride())
    return {"meta": meta, "pointers": pointers, "inconsistent": inconsistent[:50], "inconsistent_count": len(inconsistent)}


def checksums(outputs: Sequence[Sequence[torch.Tensor]], weights: Sequence[torch.Tensor]) -> list[list[float]]:
    """sum(output * weight) for every call and output (the commitment, where outputs cannot be read
    from outside: device memory)."""
    table = [[float("nan")] * len(call) for call in outputs]
    slots: list[tuple[int, int]] = []
    dots: list[torch.Tensor] = []
    for i, call in enumerate(outputs):
        for index, (tensor, weight) in enumerate(zip(call, weights)):
            if type(tensor) is torch.Tensor and tensor.numel() == weight.numel() and tensor.device == weight.device:
                slots.append((i, index))
                dots.append(torch.dot(tensor.reshape(-1).to(torch.float32), weight))
    if dots:
        for (i, index), value in zip(slots, torch.stack(dots).tolist()):
            table[i][index] = value
    return table


def commit_weights(spec: WorkloadSpec, seed: int, *, device: str) -> list[torch.Tensor]:
    weights = []
    for index, shape in enumerate(suite.output_shapes(spec)):
        generator = torch.Generator(device=device).manual_seed(suite.derive_seed(seed, spec.key, "commit", index))
        size = 1
        for dim in shape:
            size *= dim
        weights.append(torch.randn(size, generator=generator, device=device, dtype=torch.float32))
    return weights


class CallLane:
    """The thread every CPU call runs in (checks, timed calls, probes alike, for every arm).

    A thread other than the main one allocates from a glibc arena of its own, an mmap'd heap at a
    64 MiB-aligned address, where the main thread's heap follows the program's break. With every
    call's fresh outputs on the main heap, eight plain processes running the rmsnorm baseline
    differed by 10-14% (SD) from each other and each kept its place; the same calls in one other
    thread: 1-2%, with no process keeping its place (`benchmarks/process_bias.py`, variants plain
    and one-thread, 2026-12-05). That comparison also differed in the random heap spacer (plain
    drew one per turn, one-thread none), which on 2026-12-06 turned out to be the larger part:
    in one thread with the spacer, eight processes differed by 8-11% again (docs/figures.md, "the
    heap spacer"). Started before any candidate code is loaded, after the lock-down
    (so under the same seccomp filter and Landlock rules), named `dyno-calls` so the parent can
    check the thread id the worker reports before it reads its scheduler statistics."""

    NAME = b"dyno-calls"

    def __init__(self) -> None:
        import queue

        self._inbox: Any = queue.SimpleQueue()
        self._outbox: Any = queue.SimpleQueue()
        self._threads = torch.get_num_threads()
        self.tid = 0
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="dyno-calls", daemon=True)
        self._thread.start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(self.NAME), 0, 0, 0)  # PR_SET_NAME
        self.tid = threading.get_native_id()
        # OpenMP's thread count is per calling thread: this one gets the worker's, and its pool
        # starts now, so threads a call starts are the candidate's.
        torch.set_num_threads(self._threads)
        torch.ones(1 << 16).mul(2).sum()
        torch.ones(64, 64) @ torch.ones(64, 64)
        started.set()
        while True:
            work = self._inbox.get()
            try:
                self._outbox.put((True, work()))
            except BaseException as exc:  # handed back to the main thread, which raises it
                self._outbox.put((False, exc))

    def run(self, work: Callable[[], Any]) -> Any:
        self._inbox.put(work)
        ok, value = self._outbox.get()
        if not ok:
            raise value
        return value


class KernelWorker:
    """Serves the parent: bind, load, run, fetch, release. Every call the candidate sees
    (checks, timed calls, probes, re-validation) comes through `op_run` on slot views of one
    read-only mapping: nothing tells a check from a timed call."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.spec: WorkloadSpec | None = None
        self.kernel: Callable[..., Any] | None = None
        self.layout: SlotLayout | None = None
        self.mapping: Any = None
        self.views: list[tuple[torch.Tensor, ...]] = []
        self.results: list[Any] = []
        self.outputs: list[list[torch.Tensor]] = []
        self.weights: list[torch.Tensor] = []
        self.flush: torch.Tensor | None = None
        self.loads = 0
        self.called = False
        # Stepped samples: the parent's reveal counter (in the shared file's control page) and the
        # worker's own "done" record, which the parent reads from outside: call number, then
        # (address, bytes) of every output of that call.
        self.counter: ctypes.c_uint64 | None = None
        self.counter_address = 0  # the parent sleeps on this word's low half while a call runs (runners.audit.futex)
        self._control: mmap.mmap | None = None
        self.done: Any = None
        self._done_map: mmap.mmap | None = None
        self.elsize = 1
        self.done_outputs = 0
        self.lane = CallLane() if device == "cpu" else None

    def handle(self, op: str, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        method = getattr(self, f"op_{op}", None)
        if method is None:
            raise ValueError(f"unknown op {op!r}")
        return method(header)

    def op_ping(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        return {"pid": os.getpid()}, []

    def op_bind(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Map a spec's shared input file. Sent before any candidate code is loaded, so the address
        reported here is the harness's own."""
        self.spec = WorkloadSpec.from_dict(header["spec"])
        self.results, self.outputs, self.views = [], [], []
        self.mapping = None
        gc.collect()
        self.layout = SlotLayout.for_spec(self.spec, int(header["slots"]))
        self.elsize = torch.empty((), dtype=self.spec.torch_dtype).element_size()
        self.mapping, base = map_inputs(str(header["path"]), self.layout.nbytes)
        self._control, self.counter_address = map_control(str(header["path"]), self.layout.control)
        self.counter = ctypes.c_uint64.from_address(self.counter_address)
        outputs = len(suite.output_shapes(self.spec))
        words = DoneRecord.words_for(outputs)
        self.done_outputs = outputs
        self.done = None
        if header.get("done_path"):  # the parent's page in this worker's scratch directory
            fd = os.open(str(header["done_path"]), os.O_RDWR | os.O_CLOEXEC)
            try:
                self._done_map = mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            self.done = (ctypes.c_uint64 * words).from_buffer(self._done_map)
        host = [self.layout.views(base, slot) for slot in range(self.layout.slots)]
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device).index or 0)
            self.views = [tuple(t.to(self.device) for t in views) for views in host]
        else:
            self.views = host
        return {"base": base.data_ptr(), "nbytes": self.layout.nbytes, "stepped": self.done is not None,
                "calls_tid": self.lane.tid if self.lane is not None else os.getpid()}, []

    def op_load(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.kernel = None
        self.loads += 1
        # A real file, so tracebacks, inspect.getsource and triton.jit see the source.
        path = os.path.join(os.getcwd(), f"{header.get('module', 'candidate')}_{self.loads}.py")
        with open(path, "w") as handle:
            handle.write(header["source"])
        name = f"dyno_candidate_{self.loads}"
        threads_before = checks.python_threads()
        try:
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        except BaseException as exc:
            raise candidate_fault(exc, during="importing the candidate", import_phase=True) from None
        kernel = getattr(module, "kernel", None)
        if not callable(kernel):
            raise WorkerFault("sandbox.no_kernel", "the module defines no callable `kernel(*inputs)`")
        self.kernel = kernel
        self.called = False
        started = checks.python_threads() - threads_before
        if started:
            names = sorted(t.name for t in threading.enumerate() if t.ident in started)
            raise WorkerFault(
                "integrity.thread_left_running",
                f"importing the candidate started {len(started)} thread(s) that are still running ({', '.join(names)[:200]}); "
                "start worker threads inside a call and join them before it returns",
            )
        if self.device.startswith("cuda") and self.flush is None and int(header.get("l2_flush_bytes", 0)):
            self.flush = torch.empty(int(header["l2_flush_bytes"]) // 4, dtype=torch.int32, device=self.device)
        return {}, []

    def op_run(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Time one sample: one call per listed slot, then say where the outputs are."""
        assert self.spec is not None and self.kernel is not None
        # A new sample: the last one's outputs go. No random heap offset is drawn: a small block of
        # random size per sample (tried until 2026-12-06) set each process's heap into a state of
        # its own that it kept, and that state, not the process, was the per-process effect of
        # memory-bound workloads (docs/figures.md, "the heap spacer").
        self.results, self.outputs = [], []
        if header.get("commit_seed") is not None:
            self.weights = commit_weights(self.spec, int(header["commit_seed"]), device=self.device)
        if self.device.startswith("cuda"):
            self._upload([int(slot) for slot in header["slots"]])
        calls = [self.views[int(slot)] for slot in header["slots"]]
        results: list[Any] = [None] * len(calls)
        reply: dict[str, Any] = {}
        stepped = header.get("step_base") is not None and self.done is not None and not self.device.startswith("cuda")
        step_base = int(header["step_base"]) if stepped else None
        body = lambda: self._run_calls(calls, results, reply, step_base)  # noqa: E731
        reply["threads_left"] = self.lane.run(body) if self.lane is not None else body()
        self.results = results  # alive until the next sample: the parent reads them from outside
        reply.update(describe(results, expect_tuple=suite.returns_tuple(self.spec)))
        if self.weights:
            self.outputs = [list(r) if isinstance(r, (tuple, list)) else [r] for r in results]
            reply["checksums"] = checksums(self.outputs, self.weights)
        return reply, []

    def _run_calls(self, calls: list[tuple[torch.Tensor, ...]], results: list[Any], reply: dict[str, Any],
                   step_base: int | None) -> int:
        """The sample's calls (in the call lane on CPU); returns how many Python threads started
        after the first call are still running (counted from the thread that ran the calls)."""
        kernel = self.kernel
        assert kernel is not None
        first = 0
        if step_base is not None:
            self._report_ready(step_base)
        with torch.no_grad():
            try:
                if not self.called and calls:
                    # The very first call may start runtime pools (torch.compile, Triton); threads
                    # any later call starts and leaves running are the candidate's.
                    if step_base is not None:
                        self._await(step_base + 1)
                    results[0], first, self.called = kernel(*calls[0]), 1, True
                    if step_base is not None:
                        self._report_done(step_base + 1, results[0])
                threads_before = checks.python_threads()
                if self.device.startswith("cuda"):
                    reply["calls"] = self._time_cuda(calls, results, first)
                elif step_base is not None:
                    reply.update(self._time_stepped(calls, results, first, step_base))
                else:
                    c0 = time.process_time_ns()
                    t0 = time.perf_counter_ns()
                    for index in range(first, len(calls)):
                        results[index] = kernel(*calls[index])
                    t1 = time.perf_counter_ns()
                    c1 = time.process_time_ns()
                    reply.update(t0=t0, t1=t1, cpu_timed_ns=c1 - c0)
            except BaseException as exc:
                raise candidate_fault(exc, during="a call") from None
        return len(checks.python_threads() - threads_before)

    def _await(self, number: int) -> None:
        """Spin until the parent's counter reads `number`. Where the parent holds this core
        between calls (sample.CoreFence), it reads `number` already when this thread runs again;
        otherwise the spin is the harness's wait (a blocked thread takes tens of microseconds to
        wake), the same in every arm."""
        counter = self.counter
        assert counter is not None
        while counter.value != number:
            pass

    def _report_ready(self, base: int) -> None:
        """The request is read and this thread waits for call 0: the parent announces it now."""
        self.done[DoneRecord.NUMBER] = base
        futex.wake(self.counter_address)

    def _report_done(self, number: int, result: Any) -> None:
        """Where call `number`'s outputs are, then its number: the parent may read them from now on."""
        done, elsize = self.done, self.elsize
        items = result if isinstance(result, (tuple, list)) else (result,)
        slot = DoneRecord.OUTPUTS
        for position in range(self.done_outputs):
            item = items[position] if position < len(items) else None
            if type(item) is torch.Tensor and item.is_cpu:
                span = 0
                if item.numel():
                    span = elsize
                    for size, stride in zip(item.shape, item.stride()):
                        span += (size - 1) * stride * elsize
                done[slot], done[slot + 1] = item.data_ptr(), max(0, span)
            else:
                done[slot], done[slot + 1] = 0, 0
            slot += 2
        done[DoneRecord.NUMBER] = number
        futex.wake(self.counter_address)

    def _spans(self) -> list[tuple[int, int, int]]:
        """(address word, output position, bytes) of each output as `_report_done` just wrote
        them: the byte counts stay in the record for the sample's later calls (every call of a
        sample returns outputs of one layout, or the sample fails for it)."""
        done = self.done
        return [(DoneRecord.OUTPUTS + 2 * position, position, int(done[DoneRecord.OUTPUTS + 2 * position + 1]))
                for position in range(self.done_outputs)]

    def _time_stepped(self, calls: list[tuple[torch.Tensor, ...]], results: list[Any], first: int, base: int) -> dict[str, Any]:
        """One call at a time: call i starts when the parent's counter reads base + i + 1 (its
        values are in place then, and no later call's are) and is done when the worker writes that
        number, after the addresses of its outputs, to `self.done`.

        The parent bills each call's window, announcement to done record, and a candidate may
        replace this loop in its own process, so after the first call the loop does only what any
        loop must: spin on the counter, call, keep the result, write its address and number, wake
        the parent. Red team 15 (2026-12-06) measured a leaner replacement 1.035x +- 0.016 over 17
        `cpu-ci` rmsnorm audits (about 1 us of 38 us windows) against this loop as it was, with a
        clock pair, a method call for the spin and running totals in every call. The worker's own
        clock is only held to fit inside the parent's windows: it times the first call alone."""
        assert self.kernel is not None
        if first >= len(calls):
            return {}
        kernel, counter = self.kernel, self.counter
        assert counter is not None
        clock = time.perf_counter_ns
        number = base + first + 1
        self._await(number)
        t0 = clock()
        result = kernel(*calls[first])
        t1 = clock()
        results[first] = result
        self._report_done(number, result)
        spans = self._spans()
        # One output (the common case): its word, or None where its span is empty (address 0).
        single = spans[0][0] if len(spans) == 1 else None
        address_too = bool(spans[0][2]) if single is not None else False
        done, number_word = self.done, DoneRecord.NUMBER
        wake, counter_address = futex.wake, self.counter_address
        for index in range(first + 1, len(calls)):
            number = base + index + 1
            while counter.value != number:
                pass
            result = kernel(*calls[index])
            results[index] = result
            if single is not None and type(result) is torch.Tensor:
                done[single] = result.data_ptr() if address_too else 0
            else:
                items = result if isinstance(result, (tuple, list)) else (result,)
                for word, position, span in spans:
                    item = items[position] if position < len(items) else None
                    done[word] = item.data_ptr() if span and type(item) is torch.Tensor else 0
            done[number_word] = number
            wake(counter_address)  # the parent, holding this core, takes it back at once
        # No CPU clock per call either (two system calls a call): the parent judges stepped
        # samples on its own clock around each call and the kernel's accounting of the tree.
        return {"t0": t0, "t1": clock(), "timed_ns": max(1, t1 - t0)}

    def _upload(self, slots: list[int]) -> None:
        """GPUs: this sample's values from the shared file to the device copies, before any timer."""
        assert self.layout is not None
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = torch.frombuffer(self.mapping, dtype=torch.uint8, count=self.layout.nbytes)
        for slot in dict.fromkeys(slots):
            for dst, src in zip(self.views[slot], self.layout.views(base, slot)):
                dst.copy_(src)
        torch.cuda.synchronize()

    def _time_cuda(self, calls: list[tuple[torch.Tensor, ...]], results: list[Any], first: int) -> list[list[float]]:
        timed: list[list[float]] = []
        assert self.kernel is not None
        for index in range(first, len(calls)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if self.flush is not None:
                self.flush.zero_()  # evict L2, so no call finds the previous call's data
            torch.cuda.synchronize()
            h0 = time.perf_counter_ns()
            start.record()
            results[index] = self.kernel(*calls[index])
            # Device-wide: work the candidate left on other streams finishes inside the window.
            torch.cuda.synchronize()
            end.record()
            end.synchronize()
            h1 = time.perf_counter_ns()
            timed.append([h0, h1, start.elapsed_time(end) / 1e3])
        return timed

    def op_fetch(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Outputs of chosen calls, where the parent cannot read them itself (device memory)."""
        tensors: list[torch.Tensor] = []
        for index in header["indices"]:
            tensors.extend(t for t in self.outputs[int(index)] if type(t) is torch.Tensor)
        return {}, tensors

    def op_release(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.results, self.outputs, self.weights = [], [], []
        gc.collect()  # automatic collection is off; collections happen here and at bind, never in a sample
        gc.freeze()
        return {}, []
