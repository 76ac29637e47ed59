"""Measurement: the protocol parameters, input pools with secret offsets, timed runs and their checks.

The worker side (`ChildRunner`) times calls next to the candidate; the parent side treats what it
reports as a claim and checks it against its own clock, the kernel's CPU accounting, committed
output checksums, and the trusted baseline workers measured in the same rounds.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import math
import mmap
import os
import secrets
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from runners import suite, verify
from runners.sandbox import WorkerFault, Worker
from runners.suite import WorkloadSpec

# --------------------------------------------------------------------------------------------
# Protocol parameters. They are part of the manifest: changing one changes the suite hash.


@dataclass(frozen=True)
class Protocol:
    name: str
    rounds: int  # measured rounds after warm-up; each times every worker once, in random order
    warmup_rounds: int
    target_sample_s: float  # a CPU sample is a batch of calls lasting about this long
    max_calls: int  # calls per sample at most
    verify_per_round: int  # candidate outputs of timed calls fetched and verified per round
    check_distributions: tuple[str, ...]
    revalidate_sets: int
    probe_rounds: int  # caching probe: identical vs distinct inputs
    caching_tolerance: float  # flag when identical/distinct time falls this far below the baseline's
    aa_tolerance: float  # the A/A CI must lie within 1 +- this for the run to be stable
    bootstrap_resamples: int
    confidence: float
    clock_slack_abs_s: float  # unaccounted window time the candidate may have beyond trusted workers
    clock_slack_rel: float
    cpu_slack_abs_s: float  # CPU in a window beyond what the reported interval and harness allow
    cpu_slack_rel: float
    # ... plus this share of what the harness's own code costs trusted workers around the timer in
    # the same phase: that cost differs between processes (a candidate that imported Inductor
    # spent ~15% more on the harness's code per window, up to ~50% on a loaded CI box).
    cpu_slack_harness_rel: float
    background_cpu_abs_s: float  # CPU per round while idle beyond trusted workers
    background_cpu_rel: float
    prepare_cpu_slack: float  # preparing inputs may cost the candidate this much more (ratio - 1)
    settle_max_s: float  # wait at most this long for every process to go idle before a window
    load_timeout_s: float
    first_call_timeout_s: float  # the first calls may compile (torch.compile, Triton)
    call_timeout_floor_s: float
    call_timeout_factor: float  # times the baseline's duration for the same work
    l2_flush_bytes: int  # GPU: written before every timed call
    # Intra-op threads per worker; None = every core the runner may use but one (at least one),
    # which stays free for the parent and the OS: a pool spanning every core stalls a whole
    # scheduler slice (~10 ms) whenever anything else runs, and no statistic averages that away
    # (measured: rmsnorm 512x2048 on 2 cores took 3.5 ms or 30 ms per call at random).
    # cpu-ci pins one thread so CI boxes of any size measure the same thing.
    threads: int | None = None
    # CPU with one thread per worker: take the calling thread's run-queue wait off each sample
    # (see timed_run). On a shared machine that wait, not the kernel, made most of the spread.
    discount_preemption: bool = True

    def worker_threads(self) -> int:
        return self.threads or max(1, len(os.sched_getaffinity(0)) - 1)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["check_distributions"] = list(self.check_distributions)
        return data


_CPU_CI = Protocol(
    name="cpu-ci",
    rounds=15,
    warmup_rounds=1,
    # Long enough that a candidate hiding most of a sample from its own timer leaves clearly more
    # than cpu_slack_abs_s of unexplained CPU: at 3 ms a timer-compressing cheat slipped through
    # once in a loaded full test run.
    target_sample_s=0.006,
    max_calls=2000,
    verify_per_round=2,
    check_distributions=suite.DISTRIBUTIONS,
    revalidate_sets=2,
    probe_rounds=6,
    caching_tolerance=0.5,
    aa_tolerance=0.10,
    bootstrap_resamples=2000,
    confidence=0.95,
    # On CPU the kernel's CPU accounting is the sharp check; wall time on a shared box is not.
    clock_slack_abs_s=0.005,
    clock_slack_rel=0.25,
    cpu_slack_abs_s=0.001,
    cpu_slack_rel=0.15,
    cpu_slack_harness_rel=0.5,
    background_cpu_abs_s=0.005,
    background_cpu_rel=0.10,
    prepare_cpu_slack=0.5,
    settle_max_s=0.03,
    load_timeout_s=60.0,
    first_call_timeout_s=300.0,
    call_timeout_floor_s=30.0,
    call_timeout_factor=200.0,
    l2_flush_bytes=0,
    threads=1,
)
_PROTOCOLS: dict[str, Protocol] = {
    "cpu-ci": _CPU_CI,
    "cpu": replace(
        _CPU_CI, name="cpu", rounds=30, target_sample_s=0.012, verify_per_round=1, aa_tolerance=0.05, threads=None
    ),
    "gpu": replace(
        _CPU_CI,
        name="gpu",
        rounds=30,
        target_sample_s=0.002,
        max_calls=200,
        verify_per_round=1,
        aa_tolerance=0.03,
        threads=None,
        clock_slack_abs_s=0.0005,
        clock_slack_rel=0.10,
        settle_max_s=0.01,
        l2_flush_bytes=256 << 20,
        discount_preemption=False,
    ),
}


def protocol_for(profile: str) -> Protocol:
    if profile not in _PROTOCOLS:
        raise ValueError(f"no measurement protocol for profile {profile!r}; use one of {', '.join(_PROTOCOLS)}")
    return _PROTOCOLS[profile]


def quick_protocol(profile: str, *, rounds: int) -> Protocol:
    """The optimizer's search: few rounds, short samples, one check per distribution family."""
    base = protocol_for(profile)
    return replace(
        base,
        name=f"{base.name}-quick",
        rounds=max(1, rounds),
        warmup_rounds=1,
        target_sample_s=min(base.target_sample_s, 0.003),
        check_distributions=("normal", "outliers"),
        revalidate_sets=1,
        probe_rounds=0,
    )


# --------------------------------------------------------------------------------------------
# Input pools. Each round a worker generates one pool per input from a seed; each call reads a
# view at an offset the parent reveals only when the timed window opens. Views differ in address
# and content, so caching by pointer or by content never hits, and precomputing outputs for every
# possible offset would cost thousands of calls.

_MAX_OFFSETS = 4096


@dataclass(frozen=True)
class PoolPlan:
    spec: WorkloadSpec
    rows: tuple[int, ...]  # leading-dimension length of each input's pool
    align: tuple[int, ...]  # offsets are multiples of this many elements (64-byte aligned views)
    numel: tuple[int, ...]

    @classmethod
    def for_calls(cls, spec: WorkloadSpec, calls: int) -> PoolPlan:
        elsize = torch.empty((), dtype=spec.torch_dtype).element_size()
        rows, aligns, numels = [], [], []
        for layout in suite.input_layouts(spec):
            align = math.lcm(layout.row_align, max(1, 64 // elsize))
            positions = max(2 * calls + 2, min(-(-layout.numel // align), _MAX_OFFSETS))
            row_elems = math.prod(layout.shape[1:]) if len(layout.shape) > 1 else 1
            rows.append(-(-(layout.numel + align * positions) // row_elems))
            aligns.append(align)
            numels.append(layout.numel)
        return cls(spec=spec, rows=tuple(rows), align=tuple(aligns), numel=tuple(numels))

    def pool_numel(self, index: int) -> int:
        layout = suite.input_layouts(self.spec)[index]
        return self.rows[index] * (math.prod(layout.shape[1:]) if len(layout.shape) > 1 else 1)

    def offsets(self, rng: np.random.Generator, calls: int, *, identical: bool = False) -> list[list[int]]:
        """Per call, one element offset per input; distinct across calls unless `identical`."""
        per_input: list[list[int]] = []
        by_group: dict[str, list[int]] = {}
        for index, (align, layout) in enumerate(zip(self.align, suite.input_layouts(self.spec))):
            if layout.group and layout.group in by_group:
                per_input.append(by_group[layout.group])  # grouped inputs move together
                continue
            positions = (self.pool_numel(index) - self.numel[index]) // align + 1
            count = 1 if identical else calls
            picks = rng.choice(positions, size=count, replace=positions < count) * align
            per_input.append([int(p) for p in picks] * (calls if identical else 1))
            if layout.group:
                by_group[layout.group] = per_input[-1]
        return [[per_input[i][call] for i in range(len(self.align))] for call in range(calls)]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "align": list(self.align)}


def make_pools(spec: WorkloadSpec, rows: Sequence[int], *, seed: int, device: str) -> list[torch.Tensor]:
    """The pools for one round; parent and worker call this with the same seed and get the same values."""
    pools = []
    for layout, count in zip(suite.input_layouts(spec), rows):
        shape = (int(count), *layout.shape[1:])
        pools.append(
            suite.generate_tensor(
                layout,
                shape,
                seed=suite.derive_seed(seed, spec.key, layout.seed_name, "pool"),
                dtype=spec.torch_dtype,
                device=device,
                distribution="normal",
            ).reshape(-1)
        )
    return pools


def pool_views(
    layouts: Sequence[suite.InputLayout], pools: Sequence[torch.Tensor], offsets: Sequence[int]
) -> tuple[torch.Tensor, ...]:
    """One call's inputs: views into the pools at the given element offsets."""
    return tuple(pool[offset : offset + layout.numel].view(layout.shape) for pool, offset, layout in zip(pools, offsets, layouts))


def commit_weights(spec: WorkloadSpec, seed: int, *, device: str) -> list[torch.Tensor]:
    """Random weights per output; a worker must send sum(output * w) for every call when its window
    closes, which it cannot do without having computed every output by then."""
    weights = []
    for index, shape in enumerate(suite.output_shapes(spec)):
        generator = torch.Generator(device=device).manual_seed(suite.derive_seed(seed, spec.key, "commit", index))
        weights.append(torch.randn(math.prod(shape), generator=generator, device=device, dtype=torch.float32))
    return weights


def checksums(outputs: Sequence[Sequence[torch.Tensor]], weights: Sequence[torch.Tensor]) -> list[list[float]]:
    """sum(output * weight) for every call and output, read back with a single sync.

    float32 and one dot per output: converting or stacking a thousand outputs allocates (and
    page-faults) tens of MB per window, which would cost more than the calls being timed."""
    table = [[float("nan")] * len(call) for call in outputs]
    slots: list[tuple[int, int]] = []
    dots: list[torch.Tensor] = []
    for i, call in enumerate(outputs):
        for index, (tensor, weight) in enumerate(zip(call, weights)):
            if tensor.numel() == weight.numel() and tensor.device == weight.device:
                slots.append((i, index))
                dots.append(torch.dot(tensor.reshape(-1).to(torch.float32), weight))
    if dots:
        for (i, index), value in zip(slots, torch.stack(dots).tolist()):
            table[i][index] = value
    return table

def commitment_holds(claimed: float, output: torch.Tensor, weight: torch.Tensor) -> bool:
    """The parent's float64 recomputation must match the worker's float32 claim to summation error.

    The bound, 1e-4 of sum |output * weight|, is far above float32 dot error yet far below the
    random-walk size of the sum (sqrt(N) terms), so outputs replaced after the window are caught."""
    terms = output.reshape(-1).to(device=weight.device, dtype=torch.float64) * weight.to(torch.float64)
    exact = float(terms.sum())
    bound = 1e-4 * float(terms.abs().sum()) + 1e-30
    return math.isfinite(claimed) and abs(claimed - exact) <= bound


# --------------------------------------------------------------------------------------------
# Worker side.


@contextlib.contextmanager
def harness_threads() -> Iterator[None]:
    """Run the harness's own work (generating inputs, checksums) on one thread.

    A multi-thread region on a busy machine can wait a whole scheduler slice for its second
    thread; that noise would land in windows and in the CPU comparisons between workers."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _heap_spacer() -> torch.Tensor:
    """A block of random size, held for one round, that shifts where the round's outputs land.

    A round's outputs come from the same heap addresses round after round, so their offset
    within a page against the inputs' (4 KiB aliasing between loads and stores, cache sets) is
    fixed for a process by its allocation history: two identical workers ran softmax 1.1 and
    1.3 ms per call for a whole audit. A fresh random shift every round makes that layout luck
    round-to-round noise, which the paired rounds and the bootstrap see and average."""
    return torch.empty(64 * secrets.randbelow(65), dtype=torch.uint8)


def _on_fresh_pages(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` in a new anonymous mapping, so each round's inputs sit on pages the
    kernel hands out afresh. The allocator would otherwise return the same physical pages round
    after round, and a process that drew slow ones (cache-set conflicts, a distant memory bank
    behind the VM) would stay slow for the whole audit: measured, up to 50% between two
    identical baseline workers on memory-bound workloads."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return tensor
    mapping = mmap.mmap(-1, nbytes)
    fresh = torch.frombuffer(mapping, dtype=tensor.dtype, count=tensor.numel())
    fresh.copy_(tensor.reshape(-1))
    return fresh


def candidate_fault(exc: BaseException, *, during: str, import_phase: bool = False,
                    code: str | None = None) -> WorkerFault:
    """The fault a worker reports for `exc`, raised `during` a step. Running out of memory is
    `sandbox.memory_limit` whatever the step; otherwise `code` where the caller names one (the model
    audit, whose steps are not all the candidate's), else a code by what was raised and where."""
    text = f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    if isinstance(exc, MemoryError) or "out of memory" in lowered or "can't allocate memory" in lowered:
        code = "sandbox.memory_limit"
    elif code is None and isinstance(exc, SystemExit):
        code = "sandbox.exit"
    elif code is None:
        code = "sandbox.import_error" if import_phase else "sandbox.candidate_exception"
    return WorkerFault(code, f"{during}: {text}"[:2000], traceback.format_exc()[-8000:])


class ChildRunner:
    """Serves the parent's requests inside a worker: load, check, prepare, run, fetch."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.spec: WorkloadSpec | None = None
        self.kernel: Callable[..., Any] | None = None
        self.pools: list[torch.Tensor] = []
        self.weights: list[torch.Tensor] = []
        self.outputs: list[list[torch.Tensor]] = []
        self.pending: list[Any] = []  # results of the last `run`, until `commit`
        self.spacer: torch.Tensor | None = None
        self.flush: torch.Tensor | None = None
        self.loads = 0
        self.called = False

    def handle(self, op: str, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        method = getattr(self, f"op_{op}", None)
        if method is None:
            raise ValueError(f"unknown op {op!r}")
        return method(header)

    def op_ping(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        return {"pid": os.getpid()}, []

    def op_load(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.spec = WorkloadSpec.from_dict(header["spec"])
        self.kernel = None
        self.pools, self.weights, self.outputs = [], [], []
        self.loads += 1
        # A real file, so tracebacks, inspect.getsource and triton.jit see the source.
        path = os.path.join(os.getcwd(), f"{header.get('module', 'candidate')}_{self.loads}.py")
        with open(path, "w") as handle:
            handle.write(header["source"])
        name = f"dyno_candidate_{self.loads}"
        threads_before = verify.python_threads()
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
        # Nothing a module does at import needs a thread that outlives the import; one that does
        # runs beside every timed window (the baseline's too) and is refused before any call.
        started = verify.python_threads() - threads_before
        if started:
            names = sorted(t.name for t in threading.enumerate() if t.ident in started)
            raise WorkerFault(
                "integrity.thread_left_running",
                f"importing the candidate started {len(started)} thread(s) that are still running ({', '.join(names)[:200]}); "
                "start worker threads inside a call and join them before it returns",
            )
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device).index or 0)
            if self.flush is None and int(header.get("l2_flush_bytes", 0)):
                self.flush = torch.empty(int(header["l2_flush_bytes"]) // 4, dtype=torch.int32, device=self.device)
        return {}, []

    def _call(self, args: Sequence[torch.Tensor], during: str) -> Any:
        assert self.kernel is not None
        try:
            with torch.no_grad():
                return self.kernel(*args)
        except BaseException as exc:
            raise candidate_fault(exc, during=during) from None

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def op_check(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Call the kernel twice on each fresh input set; return both outputs and evidence."""
        assert self.spec is not None
        expect_tuple = suite.returns_tuple(self.spec)
        # Every set is alive at once, so no two sets share an address a pointer cache could reuse.
        with harness_threads():
            sets = [
                suite.make_inputs(self.spec, seed=int(item["seed"]), device=self.device, distribution=item["distribution"])
                for item in header["sets"]
            ]
        reports: list[dict[str, Any]] = []
        out_tensors: list[torch.Tensor] = []
        for index, inputs in enumerate(sets):
            spans = verify.storage_spans(inputs)
            before = [verify.tensor_digest(t) for t in inputs]
            threads_before = verify.python_threads()
            first = self._call(inputs, f"check set {index}")
            self._sync()
            if not self.called:
                # A candidate's very first call may start runtime pools (torch.compile, Triton);
                # threads started by any later call and still alive after it are its own.
                self.called = True
                threads_before = verify.python_threads()
            second = self._call(inputs, f"check set {index}, second call")
            self._sync()
            left = verify.python_threads() - threads_before
            after = [verify.tensor_digest(t) for t in inputs]
            tensors1, meta1 = verify.inspect_outputs(first, spans, expect_tuple=expect_tuple)
            tensors2, meta2 = verify.inspect_outputs(second, spans, expect_tuple=expect_tuple)
            report: dict[str, Any] = {
                "meta": meta1,
                "meta_second": meta2,
                "mutated": [layout.name for layout, a, b in zip(suite.input_layouts(self.spec), before, after) if a != b],
                "threads_left": len(left),
                "sent": tensors1 is not None and tensors2 is not None,
            }
            if report["sent"]:
                assert tensors1 is not None and tensors2 is not None
                out_tensors.extend(tensors1)
                out_tensors.extend(tensors2)
            reports.append(report)
        # Whatever the first calls built (a compiled graph, caches) becomes permanent, so the
        # collections in `prepare` stay as cheap for this candidate as for the baseline.
        gc.collect()
        gc.freeze()
        return {"sets": reports}, out_tensors

    def op_prepare(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        assert self.spec is not None
        self.outputs = []
        self.pools = []
        gc.collect()  # collections happen here, outside every timed window (automatic GC is off)
        gc.freeze()
        with harness_threads():
            pools = make_pools(self.spec, header["rows"], seed=int(header["seed"]), device=self.device)
            if self.device == "cpu":
                pools = [_on_fresh_pages(pool) for pool in pools]
            self.pools = pools
            self.weights = commit_weights(self.spec, int(header["commit_seed"]), device=self.device)
            if self.device == "cpu":
                self.spacer = _heap_spacer()
        self._sync()
        return {}, []

    def op_run(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Time one sample: every call in the batch, then commit to checksums of every output."""
        assert self.spec is not None and self.pools
        offsets = header["offsets"]
        layouts = suite.input_layouts(self.spec)
        views: list[tuple[torch.Tensor, ...]] = []
        built: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}
        for call_offsets in offsets:
            key = tuple(call_offsets)
            if key not in built:  # identical offsets share one set of view objects (caching probe)
                built[key] = pool_views(layouts, self.pools, call_offsets)
            views.append(built[key])
        results: list[Any] = [None] * len(views)
        reply: dict[str, Any] = {}
        if self.device.startswith("cuda"):
            reply["calls"] = self._time_cuda(views, results)
        else:
            with torch.no_grad():
                try:
                    c0 = time.process_time_ns()
                    t0 = time.perf_counter_ns()
                    for index, args in enumerate(views):
                        results[index] = self.kernel(*args)  # type: ignore[misc]
                    t1 = time.perf_counter_ns()
                    c1 = time.process_time_ns()
                except BaseException as exc:
                    raise candidate_fault(exc, during="a timed call") from None
            # Process CPU over the timed interval: the parent trusts it from trusted workers only,
            # to learn how much CPU the harness itself spends around the timer.
            reply.update(t0=t0, t1=t1, cpu_timed_ns=c1 - c0)
        # The reply goes out the moment the timer stops, so the parent's reading of this process's
        # scheduler statistics brackets the timed calls closely; `commit` follows at once.
        self.pending = results
        return reply, []

    def op_commit(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Commit to checksums of every output of the last `run`, and describe the outputs."""
        assert self.spec is not None and self.pools
        results, self.pending = self.pending, []
        reply: dict[str, Any] = {}
        expect_tuple = suite.returns_tuple(self.spec)
        spans = verify.storage_spans(self.pools)
        with harness_threads():
            self.outputs = []
            first_meta: list[dict[str, Any]] | None = None
            inconsistent: list[int] = []
            for index, result in enumerate(results):
                tensors, meta = verify.inspect_outputs(result, spans, expect_tuple=expect_tuple)
                if first_meta is None:
                    first_meta = meta
                elif meta != first_meta:
                    inconsistent.append(index)
                self.outputs.append(tensors or [])
            sums = checksums(self.outputs, self.weights)
        reply.update(meta=first_meta, inconsistent=inconsistent[:50], checksums=sums)
        return reply, []

    def _time_cuda(self, views: list[tuple[torch.Tensor, ...]], results: list[Any]) -> list[list[float]]:
        calls: list[list[float]] = []
        starts = [torch.cuda.Event(enable_timing=True) for _ in views]
        ends = [torch.cuda.Event(enable_timing=True) for _ in views]
        with torch.no_grad():
            try:
                for index, args in enumerate(views):
                    if self.flush is not None:
                        self.flush.zero_()  # evict L2, so no call finds the previous call's data
                    torch.cuda.synchronize()
                    h0 = time.perf_counter_ns()
                    starts[index].record()
                    results[index] = self.kernel(*args)  # type: ignore[misc]
                    # Device-wide: work the candidate left on other streams finishes inside the window.
                    torch.cuda.synchronize()
                    ends[index].record()
                    ends[index].synchronize()
                    h1 = time.perf_counter_ns()
                    calls.append([h0, h1, 0.0])
            except BaseException as exc:
                raise candidate_fault(exc, during="a timed call") from None
        for call, start, end in zip(calls, starts, ends):
            call[2] = start.elapsed_time(end) / 1e3
        return calls

    def op_fetch(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        tensors: list[torch.Tensor] = []
        for index in header["indices"]:
            tensors.extend(self.outputs[int(index)])
        return {}, tensors

    def op_release(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.outputs, self.pools, self.weights, self.pending = [], [], [], []
        return {}, []


# --------------------------------------------------------------------------------------------
# Parent side.


@dataclass
class RunRecord:
    """One timed sample of one worker, as the parent saw it."""

    calls: int
    per_call_s: float
    window_ns: int
    reported_ns: int
    clock_problem: str | None
    checksums: list[list[float]]
    meta: list[dict[str, Any]] | None
    inconsistent: list[int]
    cpu_window_ns: int = 0  # the kernel's count for the worker over the whole window
    cpu_timed_ns: int | None = None  # the worker's own claim for the timed interval (trusted workers only)
    preempted_ns: int = 0  # run-queue wait of the worker's calling thread over the timed calls, discounted
    cpu_run_ns: int = 0  # the kernel's count for the worker (all threads) from the request to the timer's reply

    @property
    def unaccounted_s(self) -> float:
        return (self.window_ns - self.reported_ns) / 1e9


def _clock_problem_cpu(header: dict[str, Any], sent: int, received: int) -> tuple[int, str | None]:
    t0, t1 = header.get("t0"), header.get("t1")
    if not isinstance(t0, int) or not isinstance(t1, int):
        return 0, "no timestamps"
    if not sent <= t0 <= t1 <= received:
        return max(0, t1 - t0), (
            f"timestamps [{t0}, {t1}] fall outside the parent's window [{sent}, {received}] on the same monotonic clock"
        )
    return t1 - t0, None


def _clock_problem_cuda(header: dict[str, Any], sent: int, received: int) -> tuple[int, list[float], str | None]:
    calls = header.get("calls")
    if not isinstance(calls, list) or not calls:
        return 0, [], "no per-call timings"
    previous = sent
    total = 0
    events: list[float] = []
    for h0, h1, event_s in calls:
        if not (isinstance(h0, int) and isinstance(h1, int)) or not previous <= h0 <= h1 <= received:
            return total, events, "host timestamps fall outside the parent's window or out of order"
        # The event interval lies inside the host interval; 20 us covers event resolution.
        if not 0 < float(event_s) <= (h1 - h0) / 1e9 + 20e-6:
            return total, events, f"event time {event_s:.3g} s exceeds its host interval {(h1 - h0) / 1e9:.3g} s"
        previous = h1
        total += h1 - h0
        events.append(float(event_s))
    return total, events, None


def timed_run(
    worker: Worker, offsets: list[list[int]], *, device: str, timeout: float, discount_preemption: bool = False
) -> RunRecord:
    """One timed sample: the calls, then the worker's commitment to their outputs.

    With `discount_preemption` (CPU, one thread per worker), the time the calling thread spent
    runnable but waiting for a core, which the kernel counts and the parent reads from outside,
    is taken off the sample: on a shared machine that is other processes' time, and it is what
    made samples of one kernel scatter by tens of percent. It never takes a sample below the
    worker's own CPU time over the same span (all its threads), so a candidate cannot earn a
    discount by queueing threads of its own behind the calling one."""
    wait_before = worker.runqueue_wait_ns() if discount_preemption else None
    cpu_before = worker.cpu_ns()
    reply = worker.call("run", timeout=timeout, offsets=offsets)
    wait_after = worker.runqueue_wait_ns() if discount_preemption else None
    cpu_run = worker.cpu_ns() - cpu_before
    commit = worker.call("commit", timeout=timeout)
    cpu_window = worker.cpu_ns() - cpu_before
    header = {**reply.header, **{k: commit.header.get(k) for k in ("meta", "inconsistent", "checksums")}}
    calls = len(offsets)
    preempted = 0
    if device.startswith("cuda"):
        reported, events, problem = _clock_problem_cuda(header, reply.sent_ns, reply.received_ns)
        per_call = sum(events) / len(events) if events and problem is None else reported / 1e9 / calls
    else:
        reported, problem = _clock_problem_cpu(header, reply.sent_ns, reply.received_ns)
        effective = reported
        if wait_before is not None and wait_after is not None and problem is None:
            effective = max(reported - max(0, wait_after - wait_before), min(cpu_run, reported))
            preempted = reported - effective
        per_call = effective / 1e9 / calls
    checksums = header.get("checksums")
    if not isinstance(checksums, list) or len(checksums) != calls:
        problem = problem or "no checksum commitment for every call"
        checksums = [[] for _ in range(calls)]
    return RunRecord(
        calls=calls,
        per_call_s=max(per_call, 1e-12),
        window_ns=commit.received_ns - reply.sent_ns,
        reported_ns=reported,
        clock_problem=problem,
        checksums=checksums,
        meta=header.get("meta"),
        inconsistent=list(header.get("inconsistent") or []),
        cpu_window_ns=cpu_window,
        cpu_timed_ns=int(header["cpu_timed_ns"]) if isinstance(header.get("cpu_timed_ns"), int) else None,
        preempted_ns=preempted,
        cpu_run_ns=cpu_run,
    )


def _self_cpu_ns() -> int:
    return time.process_time_ns()


class CpuLedger:
    """Attributes each worker's kernel-reported CPU time to the phase it was in, round by round."""

    PHASES = ("idle", "prepare", "window", "fetch", "check")

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, str]] = {}
        self.rounds: list[dict[int, dict[str, int]]] = [{}]

    def next_round(self) -> None:
        self.rounds.append({})

    def enter(self, worker: Worker, phase: str) -> None:
        now = worker.cpu_ns()
        last_cpu, last_phase = self._last.get(worker.pid, (now, "idle"))
        bucket = self.rounds[-1].setdefault(worker.pid, dict.fromkeys(self.PHASES, 0))
        bucket[last_phase] += max(0, now - last_cpu)
        self._last[worker.pid] = (now, phase)

    def per_round(self, worker: Worker, *phases: str) -> list[float]:
        """Seconds of CPU in `phases`, one value per round the worker took part in."""
        return [sum(r[worker.pid][p] for p in phases) / 1e9 for r in self.rounds if worker.pid in r]


def settle(workers: Sequence[Worker], *, max_wait_s: float, quiet_ns: int = 300_000) -> bool:
    """Wait until no worker (and not this process) used more than `quiet_ns` CPU over 2 ms.

    Thread pools spin for a few ms after a parallel region; starting the next window before they
    sleep would charge one process's spinning to another's timing.
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        before = [w.cpu_ns() for w in workers] + [_self_cpu_ns()]
        time.sleep(0.002)
        after = [w.cpu_ns() for w in workers] + [_self_cpu_ns()]
        if all(b - a <= quiet_ns for a, b in zip(before, after)):
            return True
        if time.monotonic() >= deadline:
            return False


# --------------------------------------------------------------------------------------------
# Roofline: physical floors and achieved throughput.

# Dense peak figures from vendor datasheets: (bytes/s, FLOP/s for 16-bit tensor cores, FLOP/s for
# fp32 inputs with TF32 tensor cores, the most a float32 workload could use).
_GPU_PEAKS: tuple[tuple[str, float, float, float], ...] = (
    ("B200", 8.0e12, 2250e12, 1100e12),
    ("H200", 4.8e12, 989e12, 495e12),
    ("H100 SXM", 3.35e12, 989e12, 495e12),
    ("H100 PCIe", 2.0e12, 756e12, 378e12),
    ("H100", 3.35e12, 989e12, 495e12),
    ("A100-SXM4-80GB", 2.039e12, 312e12, 156e12),
    ("A100", 2.039e12, 312e12, 156e12),
    ("L40S", 0.864e12, 362e12, 183e12),
    ("L4", 0.3e12, 121e12, 60e12),
)


def device_peaks(device_name: str, *, threads: int) -> dict[str, float] | None:
    """Peak bandwidth and FLOP/s of a device, or None when unknown (no floor check then)."""
    if device_name == "cpu":
        # Generous on purpose: 5 GHz, two AVX-512 FMA ports, 16-bit types at AMX rates. Caches
        # make a bandwidth floor meaningless on CPU, so only FLOP/s is bounded.
        return {"bandwidth": math.inf, "flops_16": threads * 5e9 * 2048, "flops_32": threads * 5e9 * 64}
    for key, bandwidth, flops_16, flops_32 in _GPU_PEAKS:
        if key.lower() in device_name.lower():
            return {"bandwidth": bandwidth, "flops_16": flops_16, "flops_32": flops_32}
    return None


def roofline(spec: WorkloadSpec, seconds: float, peaks: dict[str, float] | None) -> dict[str, Any]:
    """Achieved throughput of one call taking `seconds`, and its floor on this device."""
    moved, work = suite.bytes_moved(spec), suite.flops(spec)
    out: dict[str, Any] = {
        "gb_per_s": moved / seconds / 1e9,
        "tflop_per_s": work / seconds / 1e12,
        "floor_s": None,
        "fraction_of_peak": None,
    }
    if peaks is not None:
        flop_peak = peaks["flops_32"] if spec.dtype == "float32" else peaks["flops_16"]
        floor = max(moved / peaks["bandwidth"], work / flop_peak)
        out["floor_s"] = floor
        out["fraction_of_peak"] = floor / seconds
    return out
