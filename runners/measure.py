"""Measurement: the protocol parameters, and the pieces of a timed sample the whole-model audit
shares with kernel audits (settling, the CPU ledger, commitments, physical floors).

Kernel audits time through `runners.audit.sample`; the whole-model audit (`runners.modelaudit`)
through `runners.audit.model_sample`.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator, Sequence

import torch

from runners import suite
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
    # (runners.audit.sample). On a shared machine that wait, not the kernel, made most of the spread.
    discount_preemption: bool = True
    # Kernel audits judge a round's CPU as one figure (see runners.audit.kernel.judge_timing): the
    # candidate's whole process tree may exceed threads x its reported time plus what the harness
    # costs trusted workers by at most round_cpu_abs_s + round_cpu_rel x that time. Outputs are
    # read from outside and inputs written by the parent, so there is little harness work to hide
    # behind and the allowance is small.
    round_cpu_abs_s: float = 0.0002
    round_cpu_rel: float = 0.02
    # Stepped samples without the core fence: per call, the worker's own bookkeeping around each
    # call (noticing the announcement, reporting where the outputs are) runs with whatever caches
    # the kernel left, so it costs an honest candidate with a larger footprint ~2 us more per call
    # than the baseline on this VM (softmax alternative: 8.1 vs 5.9 us median); allowed per call on
    # top. Held samples (sample.CoreFence) bill that bookkeeping inside their windows: no allowance.
    round_cpu_per_call_s: float = 0.000002
    # Challenged calls per round: at least verify_per_round, and this share of a sample's calls (at
    # most 16), so skipping a few calls of a long sample is caught within a few rounds.
    verify_share: float = 0.05
    # Each arm (baseline, candidate, A/A control) is measured by this many successive worker
    # processes, fresh from the zygote, each for an equal share of the rounds after its own warm-up
    # round; the CI resamples them as clusters (runners.stats.paired_ratio_ci), so what differs
    # between processes is inside the interval instead of a bias between arms. Off (1) on every
    # profile: on this VM memory-bound workloads differ by 10-15% from process to process, and 6 to
    # 30 generations gave wider intervals and more unstable A/A controls than one process per arm
    # with the A/A widening (benchmarks/results/aa-rotation-experiment.json).
    worker_generations: int = 1
    # The whole-model audit measures up to this many times `rounds` per phase where they fit in its
    # time budget (runners.modelaudit.PHASE_BUDGET_S): forward passes of small models are cheap,
    # and the A/A interval narrows with the square root of the rounds.
    model_rounds_factor: int = 1
    # The whole-model audit's sample length (0: target_sample_s). On `gpu` a tiny Llama's forward
    # is ~4-5 ms of launches, so the kernel target (2 ms) made every sample one forward, each one
    # a first call after the other arms ran; its A/A read 0.90 [0.84, 0.95] and 1.06
    # [0.91, 1.18] on an H100 (2026-12-06) and was unstable on the H200 too (2026-12-04).
    model_target_sample_s: float = 0.0
    # Kernel audits: while the A/A control's 95% CI is wider than +- aa_target_half_width, measure
    # `extend_rounds` more rounds, up to `max_rounds_factor` x `rounds` (0: never). The rule reads
    # only the trusted workers' samples, never the candidate's, and every added round is checked
    # like the others: on this VM the A/A of the noisiest memory-bound workloads (rmsnorm, rope)
    # was +-4-5% and centred at 30 rounds, so more rounds, not a wider tolerance, make it stable.
    aa_target_half_width: float = 0.0
    extend_rounds: int = 10
    max_rounds_factor: int = 1
    # Kernel and whole-model audits (runners.audit.rounds): CPU the candidate's (or optimized
    # model's) worker may use per round while other arms are measured, beyond what the trusted
    # workers use then (0 on the development VM: after settling, every waiting
    # worker is blocked). Workers share the measurement cores, so work there steals from, and
    # pollutes the caches of, the arm being measured.
    interference_abs_s: float = 0.0005
    # Interrupts per ms on the measurement cores while the trusted workers ran, beyond those while
    # the candidate ran (runners.audit.kernel._judge_interrupts): on a VM each is an exit to the
    # hypervisor of 10-20 us, so 0.5 per ms slows an arm by 0.5-1%. Honest candidates on the
    # development VM: -0.08 to 0.08 (the 95% bounds); a storm of sleeping threads: 1.1-1.9 and up.
    interrupt_excess_per_ms: float = 0.5
    # How much longer than predicted decode's prompt prefill (timed, not billed) may take in the
    # optimized worker (runners.modelaudit._judge_prompt): the prediction is the trusted workers'
    # prompt in the same round scaled by the optimized model's own prefill speed.
    prompt_slack: float = 0.15
    # How much slower the trusted arm measured right after the candidate may run than the one that
    # is not, as the lower bound of its CI (runners.audit.rounds.next_arm_slowdown).
    next_arm_tolerance: float = 0.05
    # Measured beside a whole-model audit's arms (runners.modelaudit.REFERENCE_POINTS): what a
    # customer gets for free. Off on cpu-ci, where compiling the tiny test models costs ~45 s a run.
    model_reference_points: tuple[str, ...] = ()
    # The most one sample's distinct inputs may hold (every call its own slot): calls per sample
    # are capped to fit. Every round draws them afresh and every arm's sample copies them, so on
    # a GPU, where a call is microseconds and the inputs are tens of megabytes, this bounds a
    # round's cost (the first H200 run spent 9 minutes in one A/A audit at 1 GiB a sample).
    input_budget_bytes: int = 1 << 30

    def worker_threads(self) -> int:
        return self.threads or max(1, len(os.sched_getaffinity(0)) - 1)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["check_distributions"] = list(self.check_distributions)
        data["model_reference_points"] = list(self.model_reference_points)
        return data


_CPU_CI = Protocol(
    name="cpu-ci",
    rounds=15,
    warmup_rounds=1,
    # Long enough that a candidate hiding most of a sample from its own timer leaves clearly more
    # than the hidden-work allowance of unexplained CPU: at 3 ms a timer-compressing cheat slipped through
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
    # Whole-model audits: the optimized worker's CPU while idle (thawed only for the round's
    # checks and release), median per round beyond the trusted workers'. Honest figures on the
    # 2-core VM, tiny Llama eager and compiled (cpp-wrapper), prefill and decode: within +-0.03 ms
    # (2026-12-05). Also the least excess CPU in `prepare` that can be judged hidden work (with
    # prepare_cpu_slack). 5 ms until 2026-12-05, then 1 ms + 10% and a 1.5x prepare ratio, under
    # which a red team built the tiny Llama's per-forward constants (cache object, causal mask,
    # rotary tables: ~80 us of a ~700 us forward) for every call of a sample in `prepare` or while
    # idle and billed 1.10-1.17x for an unmodified model (sixth session).
    background_cpu_abs_s=0.0001,
    background_cpu_rel=0.02,
    prepare_cpu_slack=0.25,
    # Kernel audits' hidden work (runners.audit.kernel._judge_cpu): 0.2 ms + 2% until 2026-12-05
    # (seventh session), about 9% of a `cpu-ci` rmsnorm sample that a worker could spend before it
    # says "ready". Honest candidates held (14 audits, `cpu-ci`, benchmarks/honest_speedups.py):
    # medians -68 to +36 us a round, every lower bound below -21 us.
    round_cpu_abs_s=0.0001,
    round_cpu_rel=0.01,
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
        _CPU_CI, name="cpu", rounds=30, target_sample_s=0.012, verify_per_round=1, aa_tolerance=0.05, threads=None,
        model_rounds_factor=3, model_reference_points=("torch-compile",),
        # Whole-model samples of about 30 ms: a sample's first call pays 1-1.5 ms for caches the
        # other arms' samples left cold (the Llama sample at 2 x 512, every arm alike), which in
        # two-call samples pulled the figure towards 1: 1.255x [1.193, 1.317] at 12 ms against
        # 1.285x [1.234, 1.348] at 30 ms (four calls), 12 rounds each, 2026-12-06.
        model_target_sample_s=0.03,
        # +-1.5% as on `gpu` (2.5% until 2026-12-06): the baseline against itself read up to 6.5%
        # wide on six workloads at 30 rounds, its rounds' interval widened by the A/A's extreme.
        aa_target_half_width=0.015, max_rounds_factor=3,
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
        # Not measured on a GPU worker (the CUDA runtime's own threads): as before.
        round_cpu_abs_s=0.0002,
        round_cpu_rel=0.02,
        background_cpu_abs_s=0.005,
        background_cpu_rel=0.10,
        prepare_cpu_slack=0.5,
        settle_max_s=0.01,
        l2_flush_bytes=256 << 20,
        input_budget_bytes=256 << 20,
        discount_preemption=False,
        model_rounds_factor=3,
        model_target_sample_s=0.03,
        model_reference_points=("torch-compile",),
        aa_target_half_width=0.015,
        max_rounds_factor=3,
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
        worker_generations=1,
    )


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


# --------------------------------------------------------------------------------------------
# Parent side.


def _self_cpu_ns() -> int:
    return time.process_time_ns()


class CpuLedger:
    """Attributes each worker's kernel-reported CPU time to the phase it was in, round by round."""

    PHASES = ("idle", "prepare", "window", "fetch", "check", "release")

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

    def move(self, worker: Worker, ns: int, source: str, target: str) -> None:
        """Book `ns` of the worker's CPU in this round under `target` instead of `source` (what the
        kernel counted in one phase but the harness knows belongs to another)."""
        bucket = self.rounds[-1].get(worker.pid)
        if bucket is None or ns <= 0:
            return
        ns = min(ns, bucket[source])
        bucket[source] -= ns
        bucket[target] += ns

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
