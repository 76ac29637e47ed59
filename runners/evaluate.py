"""Evaluation: audits candidates against the suite (`audit_candidate`, `run_suite`) and grades the
optimizer's proposals quickly (`SandboxEvaluator`), both with one protocol engine (`_audit_spec`).

The parent chooses every seed, computes every reference, and judges what workers send back.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from optimizer.evaluation import Budget, Candidate, Measurement
from runners import measure, result, stats, suite, verify
from runners.fingerprint import environment_fingerprint
from runners.measure import CpuLedger, PoolPlan, Protocol, RunRecord
from runners.sandbox import Sandbox, SandboxConfig, SandboxError, Worker
from runners.suite import WorkloadSpec
from runners.verify import Judgement, Reason

Progress = Callable[[float, str], None]

REFERENCE_POINTS: dict[str, str] = {
    # name -> module source template; {fn} is the baseline function's name in runners.suite.
    "torch-compile": "import torch\nfrom runners.suite import {fn} as _baseline\nkernel = torch.compile(_baseline, dynamic=False)\n",
}

# Which check a reason code fails; `checks` in results maps each to True / False / None (not run).
_CHECK_OF_CODE: dict[str, str] = {
    "correctness.mismatch": "reference_match",
    "correctness.nonfinite": "finite",
    "correctness.all_zero": "not_all_zero",
    "correctness.output_type": "output_type",
    "correctness.shape": "output_shape",
    "correctness.dtype": "output_dtype",
    "correctness.device": "output_device",
    "correctness.nondeterministic": "deterministic",
    "correctness.timed_output_mismatch": "timed_outputs",
    "correctness.revalidation_failed": "revalidation",
    "integrity.input_mutated": "inputs_unchanged",
    "integrity.output_aliases_input": "no_aliasing",
    "integrity.thread_left_running": "no_threads_left",
    "integrity.background_cpu": "no_background_cpu",
    "integrity.commitment_mismatch": "outputs_committed",
    "integrity.stray_process": "no_stray_processes",
    "integrity.cpus_widened": "pinned_cpus",
    "timing.clock_mismatch": "clock_consistent",
    "timing.caching_suspected": "no_caching",
    "timing.below_physical_floor": "above_physical_floor",
}
_CHECK_PHASE_CHECKS = (
    "reference_match", "finite", "not_all_zero", "output_type", "output_shape", "output_dtype",
    "output_device", "deterministic", "inputs_unchanged", "no_aliasing", "no_threads_left",
)
_TIMING_CHECKS = ("timed_outputs", "outputs_committed", "clock_consistent", "no_background_cpu", "above_physical_floor", "pinned_cpus")


class HarnessError(RuntimeError):
    """The audit could not run for a reason that is not the candidate's (bad arguments, broken baseline)."""


# --------------------------------------------------------------------------------------------
# Sessions: the sandbox and trusted workers shared by every spec of one audit, suite or search.


class AuditSession:
    """A sandbox plus trusted baseline workers, reused across specs and candidates."""

    def __init__(self, *, device: str, sandbox: Sandbox | None = None, config: SandboxConfig | None = None) -> None:
        self.device = device
        self._own_sandbox = sandbox is None
        self.sandbox = sandbox or Sandbox(config or SandboxConfig(device=device))
        self._trusted: list[Worker] = []
        self._loaded: dict[int, str] = {}
        # Calibrated once per spec: (calls per sample, the baseline's seconds per call).
        self.calibration: dict[str, tuple[int, float]] = {}

    def __enter__(self) -> AuditSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def baselines(self, spec: WorkloadSpec, count: int, protocol: Protocol) -> list[Worker]:
        """`count` trusted workers with the spec's baseline loaded (two for an A/A control)."""
        self._trusted = [w for w in self._trusted if w.failure is None]
        while len(self._trusted) < count:
            try:
                self._trusted.append(self.sandbox.spawn("baseline"))
            except SandboxError as exc:
                raise HarnessError(f"could not start a baseline worker: {exc} {exc.detail}") from exc
        workers = self._trusted[:count]
        for worker in workers:
            if self._loaded.get(worker.pid) != spec.key:
                _load(worker, spec, suite.baseline_source(spec), protocol, label="baseline")
                self._loaded[worker.pid] = spec.key
        return workers

    def close(self) -> None:
        for worker in self._trusted:
            worker.close()
        self._trusted.clear()
        if self._own_sandbox:
            self.sandbox.close()


def _load(worker: Worker, spec: WorkloadSpec, source: str, protocol: Protocol, *, label: str) -> None:
    try:
        worker.call(
            "load",
            timeout=protocol.load_timeout_s,
            spec=spec.to_dict(),
            source=source,
            module=label,
            l2_flush_bytes=protocol.l2_flush_bytes,
        )
    except SandboxError as exc:
        if worker.trusted:
            raise HarnessError(f"the {label} failed to load for {spec.key}: {exc} {exc.detail}") from exc
        raise


# --------------------------------------------------------------------------------------------
# The protocol engine for one spec.


@dataclass
class _Slot:
    label: str
    worker: Worker
    runs: list[RunRecord] = field(default_factory=list)  # measured rounds only

    @property
    def samples(self) -> list[float]:
        return [run.per_call_s for run in self.runs]


@dataclass
class _Outcome:
    """Everything one spec's evaluation found; turned into a result entry or a Measurement."""

    spec: WorkloadSpec
    verdict: str = "accepted"
    reasons: list[Reason] = field(default_factory=list)
    checks: dict[str, bool | None] = field(default_factory=lambda: dict.fromkeys(_CHECK_OF_CODE.values()))
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    baseline: list[float] = field(default_factory=list)
    baseline_aa: list[float] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    references: dict[str, list[float] | str] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)

    def fail(self, reasons: Sequence[Reason]) -> None:
        for reason in reasons:
            if all(r.code != reason.code for r in self.reasons):  # one entry per code: the first says it
                self.reasons.append(reason)
            check = _CHECK_OF_CODE.get(reason.code)
            if check is not None:
                self.checks[check] = False

    def passed(self, names: Sequence[str]) -> None:
        for name in names:
            if self.checks[name] is None:
                self.checks[name] = True

    def errored(self, exc: SandboxError) -> None:
        # A worker that refused the candidate for what it did (integrity.*) judged it; any other
        # failure means it could not be judged.
        self.verdict = "rejected" if exc.code.startswith("integrity.") else "error"
        hint = _log_hint(exc.detail)
        message = f"{exc.message} | {hint}" if hint else exc.message
        self.fail([Reason(exc.code if exc.code in verify.REASON_CODES else "sandbox.protocol", message)])

    def absorb(self, judgement: Judgement) -> None:
        self.fail(judgement.reasons)
        self.max_abs_err = max(self.max_abs_err or 0.0, judgement.max_abs_err)
        self.max_rel_err = max(self.max_rel_err or 0.0, judgement.max_rel_err)


def _log_hint(detail: str) -> str:
    """The informative lines of a worker's log or traceback: the fatal error and candidate frames."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    keep = [l for l in lines if "Fatal Python error" in l or "candidate_" in l or l.startswith(("File", "Error", "Traceback"))]
    if lines and not lines[-1].startswith("File"):
        keep.append(lines[-1])  # a traceback's last line names the exception
    return " / ".join(dict.fromkeys(keep))[-600:]


def _as_tuple(value: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _check_sets(seed: int, spec: WorkloadSpec, distributions: Sequence[str], phase: str) -> list[dict[str, Any]]:
    return [
        {"seed": suite.derive_seed(seed, spec.key, phase, index), "distribution": distribution}
        for index, distribution in enumerate(distributions)
    ]


def _judge_check(
    spec: WorkloadSpec,
    reply_sets: list[dict[str, Any]],
    tensors: list[torch.Tensor],
    sets: list[dict[str, Any]],
    *,
    device: str,
    failure_code: str,
    phase: str,
) -> Judgement:
    """Judge a worker's check reply against references the parent computes from its own inputs."""
    judgement = Judgement()
    if not isinstance(reply_sets, list) or len(reply_sets) != len(sets):
        judgement.reasons.append(Reason("correctness.output_type", f"{phase}: the worker answered for the wrong number of input sets"))
        return judgement
    shapes = suite.output_shapes(spec)
    atol, rtol = suite.tolerance(spec)
    cursor = 0
    for index, (report, item) in enumerate(zip(reply_sets, sets)):
        where = f"{phase} set {index} ({item['distribution']})"
        meta_reasons = verify.check_output_meta(
            report.get("meta"), expected_shapes=shapes, dtype=spec.dtype, device_type=torch.device(device).type, where=where
        ) + verify.check_output_meta(
            report.get("meta_second"), expected_shapes=shapes, dtype=spec.dtype, device_type=torch.device(device).type, where=f"{where}, second call"
        )
        judgement.reasons.extend(r for r in meta_reasons if r not in judgement.reasons)
        unusable = any(r.code != "integrity.output_aliases_input" for r in meta_reasons)
        if report.get("mutated"):
            judgement.reasons.append(Reason("integrity.input_mutated", f"{where}: changed input(s) {', '.join(report['mutated'])}"))
        if report.get("threads_left"):
            judgement.reasons.append(
                Reason("integrity.thread_left_running", f"{where}: {report['threads_left']} thread(s) still running after the call returned")
            )
        if not report.get("sent"):
            continue
        first, second = tensors[cursor : cursor + len(shapes)], tensors[cursor + len(shapes) : cursor + 2 * len(shapes)]
        cursor += 2 * len(shapes)
        if len(first) != len(shapes) or len(second) != len(shapes):
            judgement.reasons.append(Reason("correctness.shape", f"{where}: outputs missing from the reply"))
            break
        if unusable:
            continue  # type/shape/dtype problems are already reported; values would only repeat them
        inputs = suite.make_inputs(spec, seed=item["seed"], device=device, distribution=item["distribution"])
        refs = _as_tuple(suite.reference(spec, inputs))
        masks = suite.check_mask(spec, inputs)
        judgement.merge(verify.judge_outputs(first, refs, masks, atol=atol, rtol=rtol, where=where, failure_code=failure_code))
        judgement.reasons.extend(
            r
            for r in verify.judge_determinism(first, second, refs, masks, atol=atol, rtol=rtol, where=where)
            if r not in judgement.reasons
        )
    return judgement


def _discounts(protocol: Protocol, worker: Worker, device: str) -> bool:
    """Preemption is discounted on CPU when each worker computes on one thread: that thread's
    run-queue wait is then exactly the time other processes took from the sample."""
    return protocol.discount_preemption and device == "cpu" and worker.sandbox.config.threads == 1


def _run_timeout(protocol: Protocol, per_call_s: float, calls: int) -> float:
    return max(protocol.call_timeout_floor_s, protocol.call_timeout_factor * per_call_s * calls)


def _calibrate(worker: Worker, spec: WorkloadSpec, protocol: Protocol, *, seed: int, device: str) -> tuple[int, float]:
    """Calls per sample so that a sample lasts about `target_sample_s` for the baseline."""
    probe_calls = 8
    plan = PoolPlan.for_calls(spec, probe_calls)
    rng = np.random.default_rng(suite.derive_seed(seed, spec.key, "calibrate-offsets"))
    worker.call("prepare", timeout=protocol.call_timeout_floor_s * 4, rows=list(plan.rows), seed=suite.derive_seed(seed, spec.key, "calibrate"), commit_seed=0)
    timeout = protocol.call_timeout_floor_s * 4
    measure.timed_run(worker, plan.offsets(rng, 1), device=device, timeout=timeout, discount_preemption=_discounts(protocol, worker, device))
    single = measure.timed_run(worker, plan.offsets(rng, 1), device=device, timeout=timeout, discount_preemption=_discounts(protocol, worker, device)).per_call_s
    calls = max(1, min(probe_calls, math.ceil(protocol.target_sample_s / single)))
    per_call = measure.timed_run(worker, plan.offsets(rng, calls), device=device, timeout=timeout, discount_preemption=_discounts(protocol, worker, device)).per_call_s
    worker.call("release", timeout=timeout)
    return max(1, min(protocol.max_calls, math.ceil(protocol.target_sample_s / per_call))), per_call


def _audit_spec(
    session: AuditSession,
    spec: WorkloadSpec,
    source: str,
    *,
    protocol: Protocol,
    seed: int,
    aa_control: bool = True,
    reference_points: Sequence[str] = (),
    deadline: float | None = None,
    progress: Progress | None = None,
) -> _Outcome:
    """Check, calibrate, probe, time in interleaved rounds, re-validate; judge all of it."""
    device = session.device
    outcome = _Outcome(spec=spec)
    note = progress or (lambda fraction, message: None)
    trusted = session.baselines(spec, 2 if aa_control else 1, protocol)
    sets = _check_sets(seed, spec, protocol.check_distributions, "check")
    # The baseline must pass its own suite; if it does not, the suite (not the candidate) is wrong.
    baseline_check = trusted[0].call("check", timeout=protocol.first_call_timeout_s, sets=sets)
    sanity = _judge_check(spec, baseline_check.header["sets"], baseline_check.tensors, sets, device=device, failure_code="correctness.mismatch", phase="baseline check")
    if not sanity.passed:
        raise HarnessError(f"the baseline fails suite checks for {spec.key}: {[r.message for r in sanity.reasons]}")

    candidate = session.sandbox.spawn("candidate")
    references: dict[str, Worker] = {}
    try:
        try:
            note(0.05, f"{spec.key}: loading candidate")
            _load(candidate, spec, source, protocol, label="candidate")
            note(0.10, f"{spec.key}: checking outputs")
            reply = candidate.call("check", timeout=protocol.first_call_timeout_s + protocol.call_timeout_floor_s, sets=sets)
            outcome.absorb(_judge_check(spec, reply.header.get("sets"), reply.tensors, sets, device=device, failure_code="correctness.mismatch", phase="check"))
        except SandboxError as exc:
            outcome.errored(exc)
            return outcome
        if outcome.reasons:
            outcome.verdict = "rejected"
            return outcome
        outcome.passed(_CHECK_PHASE_CHECKS)

        for name in reference_points:
            references[name] = session.sandbox.spawn("reference")
            try:
                _load(references[name], spec, REFERENCE_POINTS[name].format(fn=suite.baseline_fn(spec).__name__), protocol, label=name)
                references[name].call("check", timeout=protocol.first_call_timeout_s, sets=sets[:1])
            except (SandboxError, HarnessError) as exc:
                outcome.references[name] = f"unavailable: {exc}"
                references.pop(name).kill()

        note(0.20, f"{spec.key}: calibrating")
        calibration_key = f"{spec.key}/{protocol.name}"
        if calibration_key not in session.calibration:
            session.calibration[calibration_key] = _calibrate(trusted[0], spec, protocol, seed=seed, device=device)
        calls, baseline_per_call = session.calibration[calibration_key]
        timeout = _run_timeout(protocol, baseline_per_call, calls)
        plan = PoolPlan.for_calls(spec, calls)
        offsets_rng = np.random.default_rng(suite.derive_seed(seed, spec.key, "offsets"))
        order_rng = np.random.default_rng(suite.derive_seed(seed, spec.key, "order"))
        ledger = CpuLedger()
        everyone = [*trusted, candidate, *references.values()]
        try:
            if protocol.probe_rounds:
                note(0.25, f"{spec.key}: caching probe")
                _caching_probe(outcome, trusted[0], candidate, plan, protocol, seed=seed, calls=calls, timeout=timeout, device=device, everyone=everyone)
            slots = [_Slot("baseline", trusted[0]), _Slot("candidate", candidate)]
            if aa_control:
                slots.append(_Slot("baseline_aa", trusted[1]))
            slots.extend(_Slot(f"ref:{name}", worker) for name, worker in references.items())
            total_rounds = protocol.warmup_rounds + protocol.rounds
            measured_rounds: list[dict[str, RunRecord]] = []
            for round_index in range(total_rounds):
                if deadline is not None and round_index > protocol.warmup_rounds and time.monotonic() > deadline:
                    break
                note(0.30 + 0.6 * round_index / total_rounds, f"{spec.key}: round {round_index + 1}/{total_rounds}")
                measured = round_index >= protocol.warmup_rounds
                pool_seed = suite.derive_seed(seed, spec.key, "round", round_index)
                commit_seed = suite.derive_seed(seed, spec.key, "commit", round_index)
                if measured:
                    ledger.next_round()
                for slot in slots:
                    ledger.enter(slot.worker, "prepare")
                    slot.worker.call("prepare", timeout=timeout, rows=list(plan.rows), seed=pool_seed, commit_seed=commit_seed)
                    ledger.enter(slot.worker, "idle")
                offsets = plan.offsets(offsets_rng, calls)
                records: dict[str, RunRecord] = {}
                for position in order_rng.permutation(len(slots)):
                    slot = slots[int(position)]
                    measure.settle(everyone, max_wait_s=protocol.settle_max_s)
                    ledger.enter(slot.worker, "window")
                    records[slot.label] = measure.timed_run(slot.worker, offsets, device=device, timeout=timeout, discount_preemption=_discounts(protocol, slot.worker, device))
                    ledger.enter(slot.worker, "idle")
                widened = candidate.cpus_widened()
                if widened:
                    outcome.fail([Reason("integrity.cpus_widened", f"round {round_index + 1}: the candidate's threads may run on core(s) {widened}, outside the measurement cores {session.sandbox.config.cpus}")])
                    break
                _verify_timed(outcome, candidate, records["candidate"], spec, plan, offsets, pool_seed, commit_seed, protocol, offsets_rng, device, ledger, timeout)
                for slot in slots:
                    slot.worker.call("release", timeout=timeout)
                if measured:
                    for slot in slots:
                        slot.runs.append(records[slot.label])
                    measured_rounds.append(records)
            for slot in slots:
                ledger.enter(slot.worker, "idle")
            _judge_timing(outcome, slots, ledger, measured_rounds, protocol, device=device, seed=seed)
            note(0.92, f"{spec.key}: re-validating")
            revalidate = _check_sets(seed, spec, [protocol.check_distributions[i % len(protocol.check_distributions)] for i in range(protocol.revalidate_sets)], "revalidate")
            if revalidate:
                reply = candidate.call("check", timeout=timeout * 2 + protocol.call_timeout_floor_s, sets=revalidate)
                outcome.absorb(_judge_check(spec, reply.header.get("sets"), reply.tensors, revalidate, device=device, failure_code="correctness.revalidation_failed", phase="revalidation"))
                outcome.passed(("revalidation",))
        except SandboxError as exc:
            if not candidate.trusted and candidate.failure is exc:
                outcome.errored(exc)
                return outcome
            raise HarnessError(f"a trusted worker failed during {spec.key}: {exc} {exc.detail}") from exc
        stray = session.sandbox.strays()
        if stray:
            outcome.fail([Reason("integrity.stray_process", f"killed {len(stray)} process(es) the candidate left running: {stray}")])
        else:
            outcome.passed(("no_stray_processes",))
        base_slot = slots[0]
        outcome.baseline = base_slot.samples
        outcome.candidate = slots[1].samples
        if aa_control:
            outcome.baseline_aa = slots[2].samples
        for slot in slots:
            if slot.label.startswith("ref:"):
                outcome.references[slot.label[4:]] = slot.samples
        outcome.timing["calls_per_sample"] = calls
        shares = [run.preempted_ns / run.reported_ns for slot in slots for run in slot.runs if run.reported_ns > 0]
        if shares and _discounts(protocol, candidate, device):
            # How much of the samples' wall time was other processes' (taken off; see timed_run).
            outcome.timing["preempted_share"] = {"median": stats.median(shares), "max": max(shares)}
        outcome.timing["rounds"] = len(outcome.candidate)
        outcome.timing["pool"] = plan.to_dict()
        outcome.verdict = "rejected" if outcome.reasons else "accepted"
        return outcome
    finally:
        candidate.close()
        for worker in references.values():
            worker.close()
        session.sandbox.strays()  # whatever a failed candidate left behind must not run into the next audit


def _verify_timed(
    outcome: _Outcome,
    candidate: Worker,
    record: RunRecord,
    spec: WorkloadSpec,
    plan: PoolPlan,
    offsets: list[list[int]],
    pool_seed: int,
    commit_seed: int,
    protocol: Protocol,
    rng: np.random.Generator,
    device: str,
    ledger: CpuLedger,
    timeout: float,
) -> None:
    """Fetch outputs of timed calls chosen after the window closed; check values and commitments."""
    shapes = suite.output_shapes(spec)
    meta_reasons = verify.check_output_meta(
        record.meta, expected_shapes=shapes, dtype=spec.dtype, device_type=torch.device(device).type, where="timed call 0"
    )
    if record.inconsistent:
        meta_reasons.append(
            Reason("correctness.timed_output_mismatch", f"timed calls {record.inconsistent[:5]} returned a different kind of output than call 0")
        )
    if meta_reasons:
        outcome.fail(meta_reasons)
        return
    count = min(protocol.verify_per_round, record.calls)
    picks = sorted(int(i) for i in rng.choice(record.calls, size=count, replace=False))
    ledger.enter(candidate, "fetch")
    reply = candidate.call("fetch", timeout=timeout, indices=picks, max_reply_bytes=_output_bytes(spec) * count + 4096)
    ledger.enter(candidate, "idle")
    if len(reply.tensors) != count * len(shapes):
        outcome.fail([Reason("correctness.timed_output_mismatch", "the worker did not return the sampled outputs")])
        return
    pools = measure.make_pools(spec, plan.rows, seed=pool_seed, device=device)
    weights = measure.commit_weights(spec, commit_seed, device=device)
    atol, rtol = suite.tolerance(spec)
    for slot, call in enumerate(picks):
        outputs = reply.tensors[slot * len(shapes) : (slot + 1) * len(shapes)]
        inputs = measure.pool_views(suite.input_layouts(spec), pools, offsets[call])
        refs = _as_tuple(suite.reference(spec, inputs))
        judgement = verify.judge_outputs(
            outputs, refs, suite.check_mask(spec, inputs), atol=atol, rtol=rtol, where=f"timed call {call}", failure_code="correctness.timed_output_mismatch"
        )
        outcome.absorb(judgement)
        claimed = record.checksums[call] if call < len(record.checksums) else []
        if len(claimed) != len(outputs) or not all(
            measure.commitment_holds(float(c), o.to(device), w) for c, o, w in zip(claimed, outputs, weights)
        ):
            outcome.fail([Reason("integrity.commitment_mismatch", f"timed call {call}: outputs differ from the checksum committed when its window closed")])


def _output_bytes(spec: WorkloadSpec) -> int:
    elsize = torch.empty((), dtype=spec.torch_dtype).element_size()
    return sum(math.prod(shape) for shape in suite.output_shapes(spec)) * elsize


def _caching_probe(
    outcome: _Outcome,
    baseline: Worker,
    candidate: Worker,
    plan: PoolPlan,
    protocol: Protocol,
    *,
    seed: int,
    calls: int,
    timeout: float,
    device: str,
    everyone: list[Worker],
) -> None:
    """Time identical vs distinct inputs for baseline and candidate; a cache shows as a gap only
    the candidate has."""
    rng = np.random.default_rng(suite.derive_seed(seed, plan.spec.key, "probe"))
    ratios: dict[str, list[float]] = {"baseline": [], "candidate": []}
    problems: list[str] = []
    # One pool for the whole probe (generating inputs is the dearest step for large workloads),
    # big enough that no distinct-input call in any probe round reuses another's offsets.
    probe_plan = PoolPlan.for_calls(plan.spec, calls * protocol.probe_rounds)
    distinct = probe_plan.offsets(rng, calls * protocol.probe_rounds)
    for worker in (baseline, candidate):
        worker.call("prepare", timeout=timeout, rows=list(probe_plan.rows), seed=suite.derive_seed(seed, plan.spec.key, "probe"), commit_seed=0)
    for probe in range(protocol.probe_rounds):
        batches = {True: probe_plan.offsets(rng, calls, identical=True), False: distinct[probe * calls : (probe + 1) * calls]}
        runs = [(label, identical) for label in ("baseline", "candidate") for identical in (True, False)]
        records: dict[tuple[str, bool], RunRecord] = {}
        for position in rng.permutation(len(runs)):
            label, identical = runs[int(position)]
            measure.settle(everyone, max_wait_s=protocol.settle_max_s)
            worker = baseline if label == "baseline" else candidate
            records[(label, identical)] = measure.timed_run(worker, batches[identical], device=device, timeout=timeout, discount_preemption=_discounts(protocol, worker, device))
            if label == "candidate" and records[(label, identical)].clock_problem:
                problems.append(str(records[(label, identical)].clock_problem))
        cost = {key: _probe_cost(record, records[("baseline", key[1])], device) for key, record in records.items()}
        for label in ratios:
            ratios[label].append(cost[(label, True)] / cost[(label, False)])
    for worker in (baseline, candidate):
        worker.call("release", timeout=timeout)
    ratio = {label: stats.median(values) for label, values in ratios.items()}
    # Round by round, the candidate's ratio against the baseline's of the same round; judged by the
    # upper bound of its median's CI, so probe noise on tiny kernels (ratios from 0.6 to 1.3 for
    # an honest 32x64x32 GEMM) widens the interval instead of rejecting honest work, while a cache
    # (identical calls nearly free) stays far below the line.
    relative = stats.median_ci(
        [c / max(b, 1e-12) for c, b in zip(ratios["candidate"], ratios["baseline"])],
        seed=suite.derive_seed(seed, plan.spec.key, "probe-ci") & 0xFFFFFFFF,
        resamples=protocol.bootstrap_resamples,
        confidence=protocol.confidence,
    )
    outcome.timing["caching_probe"] = {
        "identical_over_distinct": ratio,
        "candidate_over_baseline": [relative.point, relative.low, relative.high],
        "rounds": protocol.probe_rounds,
    }
    if problems:
        outcome.fail([Reason("timing.clock_mismatch", f"caching probe: {problems[0]}")])
    if relative.high < 1.0 - protocol.caching_tolerance:
        outcome.fail(
            [
                Reason(
                    "timing.caching_suspected",
                    f"identical inputs cost {ratio['candidate']:.2f}x what distinct ones do for the candidate, "
                    f"{ratio['baseline']:.2f}x for the baseline",
                )
            ]
        )
    else:
        outcome.passed(("no_caching",))


def _probe_cost(record: RunRecord, baseline: RunRecord, device: str) -> float:
    """What the calls of one probe run cost. On GPUs the device time; on CPU the kernel's CPU
    accounting (a cache saves CPU, while preemption on a shared box only inflates wall time),
    less the harness's own CPU as the trusted baseline worker reported it for the same run."""
    if device.startswith("cuda"):
        return record.per_call_s
    if record is baseline and record.cpu_timed_ns is not None:
        return max(record.cpu_timed_ns, 1000) / 1e9
    # Up to the timer's reply only (not the commitment that follows), so the harness's share to
    # take off is small and the estimate stays sharp for kernels of a few microseconds.
    harness = baseline.cpu_run_ns - (baseline.cpu_timed_ns or 0)
    return max(record.cpu_run_ns - harness, 1000) / 1e9


def _check_cpu_accounting(
    outcome: _Outcome,
    summary: dict[str, Any],
    candidate: _Slot,
    trusted: list[_Slot],
    rounds: list[dict[str, RunRecord]],
    protocol: Protocol,
    reported: float,
    *,
    seed: int,
    checked: bool,
) -> None:
    """CPU: within its reported interval a worker may use at most threads x interval of CPU; the
    rest of its window's CPU must match what the harness costs the trusted workers.

    Judged phase by phase, because a cheat's hidden work lands in one of them: in `run` (work the
    timer does not see) or in `commit` (work deferred until the outputs are read). Each phase is
    allowed its trusted cost plus a share of it, since the harness's own code runs slower in some
    processes than in others. Preemption inflates wall time, never CPU time, so this holds on a
    busy machine."""
    cores = candidate.worker.sandbox.config.threads
    bootstrap = {"resamples": protocol.bootstrap_resamples, "confidence": protocol.confidence}
    harness_run = [
        sum(r[s.label].cpu_run_ns - (r[s.label].cpu_timed_ns or 0) for s in trusted) / len(trusted) / 1e9 for r in rounds
    ]
    harness_commit = [
        sum(r[s.label].cpu_window_ns - r[s.label].cpu_run_ns for s in trusted) / len(trusted) / 1e9 for r in rounds
    ]
    run_extra = [
        (r["candidate"].cpu_run_ns - cores * r["candidate"].reported_ns) / 1e9 - cost for r, cost in zip(rounds, harness_run)
    ]
    commit_extra = [
        (r["candidate"].cpu_window_ns - r["candidate"].cpu_run_ns) / 1e9 - cost for r, cost in zip(rounds, harness_commit)
    ]
    total = stats.median_ci(
        [a + b for a, b in zip(run_extra, commit_extra)], seed=suite.derive_seed(seed, "cpu") & 0xFFFFFFFF, **bootstrap
    )
    summary["cpu_beyond_reported_s"] = [total.point, total.low, total.high]
    # Each phase may also exceed by a share of the reported time: the harness's code runs on colder
    # caches after a long or sleeping sample (measured: +0.3-1 ms on a 0.9 ms commit after 75 ms
    # of sleep). A cheat that defers its work has a short reported time, so gains nothing by it.
    timed_slack = protocol.cpu_slack_rel * cores * reported
    phases = (("run", run_extra, stats.median(harness_run)), ("commit", commit_extra, stats.median(harness_commit)))
    for phase, extra, harness in phases:  # both phases are always summarized; the first excess fails
        est = stats.median_ci(extra, seed=suite.derive_seed(seed, "cpu", phase) & 0xFFFFFFFF, **bootstrap)
        allowed = protocol.cpu_slack_abs_s + timed_slack + protocol.cpu_slack_harness_rel * harness
        summary[f"cpu_beyond_harness_{phase}_s"] = [est.point, est.low, est.high]
        summary[f"cpu_harness_{phase}_s"] = harness
        summary[f"cpu_allowed_{phase}_s"] = allowed
        if checked and est.low > allowed:
            checked = False
            where = (
                f"than {cores} thread(s) can spend in the {reported * 1e3:.2f} ms it reported"
                if phase == "run"
                else "while the harness read its outputs"
            )
            outcome.fail(
                [
                    Reason(
                        "timing.clock_mismatch",
                        f"the candidate's process used {est.point * 1e3:.2f} ms more CPU per sample {where}, beyond "
                        f"the harness's own cost ({harness * 1e3:.2f} ms; {allowed * 1e3:.2f} ms allowed): work "
                        "outside the timer, or more threads than the protocol allows",
                    )
                ]
            )


def _judge_timing(
    outcome: _Outcome,
    slots: list[_Slot],
    ledger: CpuLedger,
    rounds: list[dict[str, RunRecord]],
    protocol: Protocol,
    *,
    device: str,
    seed: int,
) -> None:
    """Cross-check the candidate's reported times against the parent's clock and the kernel's CPU
    accounting, using the trusted workers of the same rounds to learn what the harness costs.

    Excesses are judged by the lower bound of a bootstrap CI of their median, so a noisy machine
    widens the interval instead of producing false rejections (its A/A control is then unstable
    and the result is not billable anyway)."""
    candidate = next(slot for slot in slots if slot.label == "candidate")
    trusted = [slot for slot in slots if slot.label.startswith("baseline")]
    problems = [run.clock_problem for run in candidate.runs if run.clock_problem]
    reported = stats.median([run.reported_ns / 1e9 for run in candidate.runs]) if candidate.runs else 0.0
    bootstrap = {"resamples": protocol.bootstrap_resamples, "confidence": protocol.confidence}
    summary: dict[str, Any] = {}
    if problems:
        outcome.fail([Reason("timing.clock_mismatch", problems[0])])
    if rounds:
        # Wall clock: window time the candidate leaves unexplained beyond the trusted workers'.
        wall = [
            r["candidate"].unaccounted_s - sum(r[s.label].unaccounted_s for s in trusted) / len(trusted) for r in rounds
        ]
        wall_est = stats.median_ci(wall, seed=suite.derive_seed(seed, "wall") & 0xFFFFFFFF, **bootstrap)
        summary["unaccounted_extra_s"] = [wall_est.point, wall_est.low, wall_est.high]
        if not problems and wall_est.low > protocol.clock_slack_abs_s + protocol.clock_slack_rel * reported:
            outcome.fail(
                [
                    Reason(
                        "timing.clock_mismatch",
                        f"the parent's window exceeds the candidate's reported time by {wall_est.point * 1e3:.2f} ms more "
                        f"than trusted workers need (reported {reported * 1e3:.2f} ms per sample)",
                    )
                ]
            )
        if not device.startswith("cuda") and all(r[s.label].cpu_timed_ns is not None for r in rounds for s in trusted):
            _check_cpu_accounting(
                outcome, summary, candidate, trusted, rounds, protocol, reported, seed=seed, checked=not problems
            )
    # Background work, round by round against the trusted workers of the same round: CPU while
    # the worker should be idle (a thread or process working between calls), and CPU while it
    # prepares inputs (work hidden there). Identical processes differ by up to ~30% in speed on
    # a shared VM, so preparing, which costs every worker the same generation work, is compared
    # as a ratio with generous slack; idle time, near zero for honest workers, tightly.
    idle_c = ledger.per_round(candidate.worker, "idle")
    prep_c = ledger.per_round(candidate.worker, "prepare")
    idle_t = [ledger.per_round(slot.worker, "idle") for slot in trusted]
    prep_t = [ledger.per_round(slot.worker, "prepare") for slot in trusted]
    window_c = ledger.per_round(candidate.worker, "window")
    if idle_c and all(len(t) == len(idle_c) for t in idle_t + prep_t) and len(prep_c) == len(idle_c):
        mean_idle_t = [sum(v) / len(v) for v in zip(*idle_t)]
        mean_prep_t = [sum(v) / len(v) for v in zip(*prep_t)]
        idle_extra = stats.median_ci(
            [c - t for c, t in zip(idle_c, mean_idle_t)], seed=suite.derive_seed(seed, "idle") & 0xFFFFFFFF, **bootstrap
        )
        prep_ratio = stats.median_ci(
            [c / max(t, 1e-6) for c, t in zip(prep_c, mean_prep_t)], seed=suite.derive_seed(seed, "prep") & 0xFFFFFFFF, **bootstrap
        )
        idle_allowed = protocol.background_cpu_abs_s + protocol.background_cpu_rel * stats.median(window_c)
        prep_extra = stats.median([c - t for c, t in zip(prep_c, mean_prep_t)])
        summary["background_cpu_s"] = {
            "idle_candidate_per_round": stats.median(idle_c),
            "idle_trusted_per_round": stats.median(mean_idle_t),
            "idle_extra": [idle_extra.point, idle_extra.low, idle_extra.high],
            "idle_allowed_extra": idle_allowed,
            "prepare_ratio": [prep_ratio.point, prep_ratio.low, prep_ratio.high],
        }
        if idle_extra.low > idle_allowed:
            outcome.fail(
                [
                    Reason(
                        "integrity.background_cpu",
                        f"the candidate used {idle_extra.point * 1e3:.1f} ms more CPU per round than trusted workers while "
                        "it should have been idle (work between its timed windows)",
                    )
                ]
            )
        elif prep_ratio.low > 1.0 + protocol.prepare_cpu_slack and prep_extra > protocol.background_cpu_abs_s:
            outcome.fail(
                [
                    Reason(
                        "integrity.background_cpu",
                        f"preparing inputs cost the candidate {prep_ratio.point:.2f}x the CPU it cost trusted workers "
                        "(work hidden before its timed windows)",
                    )
                ]
            )
    outcome.timing.update(summary)
    outcome.passed(_TIMING_CHECKS)


# --------------------------------------------------------------------------------------------
# Turning outcomes into result entries.


def _interval(numerators: list[float], denominators: list[float], protocol: Protocol, seed: int) -> stats.Estimate | None:
    if not numerators or len(numerators) != len(denominators):
        return None
    return stats.paired_ratio_ci(
        numerators, denominators, resamples=protocol.bootstrap_resamples, confidence=protocol.confidence, seed=seed & 0xFFFFFFFF
    )


def _entry(outcome: _Outcome, *, source: str, impl: str, protocol: Protocol, seed: int, peaks: dict[str, float] | None) -> dict[str, Any]:
    spec = outcome.spec
    fin = result.finite_or_none
    base_median = stats.median(outcome.baseline) if outcome.baseline else None
    cand_median = stats.median(outcome.candidate) if outcome.candidate else None
    rounds_ci = _interval(outcome.baseline, outcome.candidate, protocol, suite.derive_seed(seed, spec.key, "bootstrap"))
    aa = _interval(outcome.baseline, outcome.baseline_aa, protocol, suite.derive_seed(seed, spec.key, "bootstrap-aa"))
    # The bootstrap over rounds cannot see what differs between processes (on a shared VM, two
    # identical baseline workers run memory-bound ops up to ~30% apart for a whole audit); the
    # A/A control measures exactly that, so the reported interval is widened by its deviation.
    process_factor = max(1.0, aa.high, 1.0 / aa.low) if aa else 1.0
    speed = (
        stats.Estimate(rounds_ci.point, rounds_ci.low / process_factor, rounds_ci.high * process_factor) if rounds_ci else None
    )
    if outcome.verdict == "accepted" and cand_median is not None and peaks is not None:
        floor = measure.roofline(spec, cand_median, peaks)["floor_s"]
        if floor is not None and cand_median < floor:
            outcome.fail([Reason("timing.below_physical_floor", f"median {cand_median:.3g} s is below the device's floor {floor:.3g} s")])
            outcome.verdict = "rejected"
    accepted = outcome.verdict == "accepted"
    atol, rtol = suite.tolerance(spec)
    refs: dict[str, Any] = {}
    for name, samples in outcome.references.items():
        if isinstance(samples, str) or not samples:
            refs[name] = {"median_s": None, "speedup_vs_baseline": None, "note": samples if isinstance(samples, str) else "no samples"}
            continue
        ref_ci = _interval(outcome.baseline, samples, protocol, suite.derive_seed(seed, spec.key, "bootstrap", name))
        refs[name] = {"median_s": stats.median(samples), "speedup_vs_baseline": fin(ref_ci.point) if ref_ci else None}
    return {
        "name": spec.name,
        "family": spec.family,
        "key": spec.key,
        "shape": dict(spec.shape),
        "dtype": spec.dtype,
        "baseline": {"impl": suite.baseline_impl(spec), "median_s": fin(base_median), "samples_s": outcome.baseline},
        "candidate": {
            "impl": impl,
            "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "median_s": fin(cand_median),
            "samples_s": outcome.candidate,
        },
        "speedup": fin(speed.point) if accepted and speed else None,
        "ci95": [speed.low, speed.high] if accepted and speed else None,
        "ci95_rounds": [rounds_ci.low, rounds_ci.high] if accepted and rounds_ci else None,
        "aa": {
            "speedup": fin(aa.point) if aa else None,
            "ci95": [aa.low, aa.high] if aa else None,
            "stable": aa.within(protocol.aa_tolerance) if aa else None,
        },
        "billable": bool(accepted and aa and aa.within(protocol.aa_tolerance)),
        "billable_speedup": fin(speed.low) if accepted and speed and aa and aa.within(protocol.aa_tolerance) else None,
        "correctness": {
            "passed": outcome.verdict != "error" and not any(r.code.startswith("correctness.") for r in outcome.reasons),
            "max_abs_err": fin(outcome.max_abs_err),
            "max_rel_err": fin(outcome.max_rel_err),
            "atol": atol,
            "rtol": rtol,
            "checks": dict(outcome.checks),
        },
        "verdict": outcome.verdict,
        "reasons": [r.to_dict() for r in outcome.reasons],
        "reference_points": refs,
        "throughput": {
            "baseline": _clean(measure.roofline(spec, base_median, peaks)) if base_median else None,
            "candidate": _clean(measure.roofline(spec, cand_median, peaks)) if cand_median and accepted else None,
        },
        "timing": _clean(outcome.timing),
    }


def _clean(value: Any) -> Any:
    """JSON has no Inf/NaN: replace them with None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _error_entry(spec: WorkloadSpec, source: str, impl: str, protocol: Protocol, seed: int, message: str) -> dict[str, Any]:
    outcome = _Outcome(spec=spec, verdict="error")
    outcome.reasons.append(Reason("harness.error", message[:2000]))
    return _entry(outcome, source=source, impl=impl, protocol=protocol, seed=seed, peaks=None)


# --------------------------------------------------------------------------------------------
# Public entry points.


def _sandbox_config(device: str, protocol: Protocol, config: SandboxConfig | None) -> SandboxConfig:
    """The caller's limits with the protocol's thread count (which is part of what is measured)."""
    config = config or SandboxConfig(device=device)
    return replace(config, device=device, threads=protocol.worker_threads())


def _resolve(profile: str, device: str | None, protocol: Protocol | None) -> tuple[str, Protocol]:
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    device = device or suite.profile_device(profile)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise HarnessError(f"device {device!r} requested but no CUDA device is visible; use --profile cpu or cpu-ci")
    return device, protocol or measure.protocol_for(profile)


def _document(
    *,
    kind: str,
    profile: str,
    device: str,
    protocol: Protocol,
    seed: int,
    session: AuditSession,
    entries: list[dict[str, Any]],
    specs: list[WorkloadSpec] | None = None,
    candidate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    document = result.build_document(
        kind=kind,
        profile=profile,
        suite_version=suite.SUITE_VERSION,
        manifest_sha256=suite.manifest_sha256(profile, protocol=protocol, specs=specs),
        environment=environment_fingerprint(device, threads=session.sandbox.config.threads),
        sandbox=session.sandbox.info(),
        protocol={**protocol.to_dict(), "seed": seed},
        workloads=entries,
        aa_tolerance=protocol.aa_tolerance,
        candidate=candidate,
    )
    result.validate_document(document)
    return document


@contextlib.contextmanager
def _session_scope(session: AuditSession | None, device: str, config: SandboxConfig | None) -> Iterator[AuditSession]:
    """The caller's session as is, or a fresh one closed on exit."""
    if session is not None:
        if session.device != device:
            raise HarnessError(f"the session measures on {session.device!r}, the audit asked for {device!r}")
        if config is not None and session.sandbox.config.threads != config.threads:
            raise HarnessError(
                f"the session's workers use {session.sandbox.config.threads} thread(s), the protocol needs {config.threads}"
            )
        yield session
        return
    with AuditSession(device=device, config=config) as fresh:
        yield fresh


class _ParentThreads:
    """The parent computes references on one thread while it audits (its idle thread pool would
    otherwise spin into the next worker's window on a small machine), then restores its setting."""

    def __enter__(self) -> None:
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self._threads)


@dataclass(frozen=True)
class _Job:
    spec: WorkloadSpec
    source: str
    impl: str
    key: str | None = None


def _audit_jobs(
    jobs: Sequence[_Job],
    *,
    kind: str,
    profile: str,
    device: str | None,
    seed: int | None,
    progress: Progress | None,
    protocol: Protocol | None,
    reference_points: Sequence[str],
    sandbox_config: SandboxConfig | None,
    session: AuditSession | None,
    own_shapes: bool,
    candidate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The engine behind every public entry point: one sandbox session, each job audited in turn.

    An audit (`kind='audit'`) stops at the first harness error; a suite records it as that
    workload's error and goes on, so one broken workload cannot hide the others' results."""
    device, protocol = _resolve(profile, device, protocol)
    for name in reference_points:
        if name not in REFERENCE_POINTS:
            raise HarnessError(f"unknown reference point {name!r}; use one of {', '.join(REFERENCE_POINTS)}")
    seed = secrets.randbits(62) if seed is None else seed
    entries: list[dict[str, Any]] = []
    with _ParentThreads(), _session_scope(session, device, _sandbox_config(device, protocol, sandbox_config)) as session:
        peaks = measure.device_peaks(environment_fingerprint(device)["device_name"], threads=session.sandbox.config.threads)
        for index, job in enumerate(jobs):
            def job_progress(fraction: float, message: str, index: int = index) -> None:
                if progress is not None:
                    progress((index + fraction) / len(jobs), message)

            try:
                outcome = _audit_spec(
                    session, job.spec, job.source, protocol=protocol, seed=seed, reference_points=reference_points, progress=job_progress
                )
                entry = _entry(outcome, source=job.source, impl=job.impl, protocol=protocol, seed=seed, peaks=peaks)
            except HarnessError as exc:
                if kind == "audit":
                    raise
                entry = _error_entry(job.spec, job.source, job.impl, protocol, seed, str(exc))
            if job.key is not None:
                entry["key"] = job.key
            entries.append(entry)
        document = _document(
            kind=kind,
            profile=profile,
            device=device,
            protocol=protocol,
            seed=seed,
            session=session,
            entries=entries,
            specs=None if own_shapes else [job.spec for job in jobs],
            candidate=candidate,
        )
    if progress is not None:
        progress(1.0, f"{kind} done" + (f": {document['verdict']}" if kind == "audit" else ""))
    return document


def audit_candidate(
    workload: str,
    source: str,
    *,
    profile: str,
    device: str | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    protocol: Protocol | None = None,
    reference_points: Sequence[str] = (),
    sandbox_config: SandboxConfig | None = None,
    label: str = "candidate",
    session: AuditSession | None = None,
) -> dict[str, Any]:
    """Audit one candidate module for `workload` at every shape `profile` has for it.

    Returns a validated `dyno.suite-result/1` document with a top-level `verdict`. Raises
    HarnessError (or ValueError for an unknown workload) when the audit cannot run at all.
    Pass an `AuditSession` to reuse its sandbox and baseline workers across audits.
    """
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    jobs = [_Job(spec, source, label) for spec in suite.find_spec(profile, workload)]
    candidate = {"label": label, "workload": workload, "source_sha256": hashlib.sha256(source.encode()).hexdigest()}
    return _audit_jobs(
        jobs,
        kind="audit",
        profile=profile,
        device=device,
        seed=seed,
        progress=progress,
        protocol=protocol,
        reference_points=reference_points,
        sandbox_config=sandbox_config,
        session=session,
        own_shapes=True,
        candidate=candidate,
    )


def run_suite(
    profile: str,
    *,
    workloads: Sequence[str] | None = None,
    candidate_sources: dict[str, str] | None = None,
    device: str | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    protocol: Protocol | None = None,
    reference_points: Sequence[str] = (),
    sandbox_config: SandboxConfig | None = None,
    session: AuditSession | None = None,
) -> dict[str, Any]:
    """Baseline vs candidate for every spec of `profile` (or of `workloads`).

    `candidate_sources` maps a workload name to a candidate module's source; a workload without
    one is measured against the baseline itself (an A/A calibration run).
    """
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    names = list(workloads) if workloads else suite.workload_names()
    for name in names:
        suite.find_spec(profile, name)  # ValueError names the valid workloads
    jobs = []
    for spec in suite.profile_specs(profile):
        if spec.name not in names:
            continue
        supplied = (candidate_sources or {}).get(spec.name)
        if supplied is None:
            jobs.append(_Job(spec, suite.baseline_source(spec), "baseline (A/A calibration)"))
        else:
            jobs.append(_Job(spec, supplied, "candidate"))
    return _audit_jobs(
        jobs,
        kind="suite",
        profile=profile,
        device=device,
        seed=seed,
        progress=progress,
        protocol=protocol,
        reference_points=reference_points,
        sandbox_config=sandbox_config,
        session=session,
        own_shapes=True,
    )


def audit_specs(
    specs: Sequence[WorkloadSpec],
    sources: Sequence[str],
    *,
    profile: str,
    keys: Sequence[str] | None = None,
    device: str | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    protocol: Protocol | None = None,
    reference_points: Sequence[str] = (),
    sandbox_config: SandboxConfig | None = None,
    label: str = "candidate",
    session: AuditSession | None = None,
) -> dict[str, Any]:
    """Audit candidates at shapes of the caller's choosing (a model's own workloads) under
    `profile`'s protocol. Returns a 'suite' document whose manifest hash covers these specs;
    `keys`, when given, become each workload entry's `key`."""
    if len(specs) != len(sources) or (keys is not None and len(keys) != len(specs)):
        raise HarnessError(f"{len(specs)} specs need as many sources (got {len(sources)}) and keys")
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    jobs = [
        _Job(spec, source, label, None if keys is None else keys[index])
        for index, (spec, source) in enumerate(zip(specs, sources))
    ]
    return _audit_jobs(
        jobs,
        kind="suite",
        profile=profile,
        device=device,
        seed=seed,
        progress=progress,
        protocol=protocol,
        reference_points=reference_points,
        sandbox_config=sandbox_config,
        session=session,
        own_shapes=False,
    )


class SandboxEvaluator:
    """The optimizer's evaluator: quick, noisy, but sandboxed and verified like an audit.

    One zygote and one trusted baseline worker live as long as the evaluator; each candidate gets
    a fresh forked worker (about 0.1 s), so evaluating many candidates stays cheap.
    """

    def __init__(
        self,
        spec: WorkloadSpec,
        *,
        device: str = "cpu",
        seed: int | None = None,
        sandbox_config: SandboxConfig | None = None,
    ) -> None:
        self.spec = spec
        self.device = device
        self._seed = secrets.randbits(62) if seed is None else seed
        self._profile = "gpu" if device.startswith("cuda") else "cpu-ci"
        self._config = _sandbox_config(device, measure.protocol_for(self._profile), sandbox_config)
        self._session: AuditSession | None = None
        self._count = 0

    def __enter__(self) -> SandboxEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate(self, candidate: Candidate, budget: Budget) -> Measurement:
        if candidate.workload != self.spec.name:
            raise ValueError(f"candidate is for {candidate.workload!r}, this evaluator grades {self.spec.name!r}")
        if self._session is None:
            self._session = AuditSession(device=self.device, config=self._config)
        self._count += 1
        protocol = measure.quick_protocol(self._profile, rounds=budget.rounds)
        seed = suite.derive_seed(self._seed, "evaluation", self._count)
        with _ParentThreads():
            outcome = _audit_spec(
                self._session,
                self.spec,
                candidate.source,
                protocol=protocol,
                seed=seed,
                aa_control=False,
                deadline=time.monotonic() + budget.max_seconds,
            )
        codes = tuple(dict.fromkeys(r.code for r in outcome.reasons))
        if outcome.verdict != "accepted" or not outcome.candidate:
            return Measurement(correct=False, median_s=None, reasons=codes)
        return Measurement(
            correct=True,
            median_s=stats.median(outcome.candidate),
            spread=stats.relative_iqr(outcome.candidate),
            baseline_median_s=stats.median(outcome.baseline),
            reasons=codes,
        )

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
