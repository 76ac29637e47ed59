"""What one spec's audit found (`Outcome`) and how it becomes a result entry.

Trusted side. One home for the check names each reason code fails and for the entry's figures.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from runners import checks, measure, result, stats, suite
from runners.measure import Protocol
from runners.sandbox import SandboxError
from runners.suite import WorkloadSpec
from runners.checks import Judgement, Reason

# Which check a reason code fails; `checks` in results maps each to True / False / None (not run).
CHECK_OF_CODE: dict[str, str] = {
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
    "integrity.interrupts_in_other_arms": "no_background_cpu",
    "integrity.slows_next_arm": "no_background_cpu",
    "timing.clock_mismatch": "clock_consistent",
    "timing.caching_suspected": "no_caching",
    "timing.below_physical_floor": "above_physical_floor",
    "timing.done_before_computed": "calls_one_at_a_time",
    "timing.snapshot_stalled": "calls_one_at_a_time",
}
CHECK_PHASE_CHECKS = (
    "reference_match", "finite", "not_all_zero", "output_type", "output_shape", "output_dtype",
    "output_device", "deterministic", "inputs_unchanged", "no_aliasing", "no_threads_left",
)
TIMING_CHECKS = ("timed_outputs", "outputs_committed", "clock_consistent", "no_background_cpu", "above_physical_floor", "pinned_cpus",
                 "calls_one_at_a_time")



@dataclass
class Outcome:
    """Everything one spec's evaluation found; turned into a result entry or a Measurement."""

    spec: WorkloadSpec
    verdict: str = "accepted"
    reasons: list[Reason] = field(default_factory=list)
    checks: dict[str, bool | None] = field(default_factory=lambda: dict.fromkeys(CHECK_OF_CODE.values()))
    max_abs_err: float | None = None
    generations: list[int] = field(default_factory=list)  # the worker generation of each measured round
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
            check = CHECK_OF_CODE.get(reason.code)
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
        self.fail([Reason(exc.code if exc.code in checks.REASON_CODES else "sandbox.protocol", message)])

    @property
    def proven_wrong(self) -> bool:
        """A correctness or integrity reason is on record: more rounds would only repeat it."""
        return any(r.code.startswith(("correctness.", "integrity.")) for r in self.reasons)

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



def _interval(numerators: list[float], denominators: list[float], protocol: Protocol, seed: int,
              clusters: list[int] | None = None) -> stats.Estimate | None:
    if not numerators or len(numerators) != len(denominators):
        return None
    if clusters is not None and len(clusters) != len(numerators):
        clusters = None
    return stats.paired_ratio_ci(
        numerators, denominators, resamples=protocol.bootstrap_resamples, confidence=protocol.confidence, seed=seed & 0xFFFFFFFF,
        clusters=clusters,
    )


def entry(outcome: Outcome, *, source: str, impl: str, protocol: Protocol, seed: int, peaks: dict[str, float] | None) -> dict[str, Any]:
    spec = outcome.spec
    fin = result.finite_or_none
    base_median = stats.median(outcome.baseline) if outcome.baseline else None
    cand_median = stats.median(outcome.candidate) if outcome.candidate else None
    clusters = outcome.generations if len(set(outcome.generations)) > 1 else None
    rounds_ci = _interval(outcome.baseline, outcome.candidate, protocol, suite.derive_seed(seed, spec.key, "bootstrap"), clusters)
    aa = _interval(outcome.baseline, outcome.baseline_aa, protocol, suite.derive_seed(seed, spec.key, "bootstrap-aa"), clusters)
    # A bootstrap over the rounds of one process per arm cannot see what differs between processes
    # (on a shared VM, two identical baseline workers run memory-bound ops up to ~30% apart for a
    # whole audit); the A/A control measures exactly that, so the interval is then widened by its
    # deviation. With several worker generations per arm the clustered bootstrap carries that
    # variance itself, and widening would count it twice.
    process_factor = max(1.0, aa.high, 1.0 / aa.low) if aa and clusters is None else 1.0
    speed = (
        stats.Estimate(rounds_ci.point, rounds_ci.low / process_factor, rounds_ci.high * process_factor) if rounds_ci else None
    )
    if outcome.verdict == "accepted" and cand_median is not None and peaks is not None:
        floor = measure.roofline(spec, cand_median, peaks)["floor_s"]
        if floor is not None and cand_median < floor:
            outcome.fail([Reason("timing.below_physical_floor", f"median {cand_median:.3g} s is below the device's floor {floor:.3g} s")])
            outcome.verdict = "rejected"
    accepted = outcome.verdict == "accepted"
    discount = hidden_discount(outcome.timing)
    if "hidden_work_s" in outcome.timing:
        outcome.timing["hidden_work_billing_factor"] = discount
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
        "billable_speedup": (fin(speed.low * discount)
                             if accepted and speed and aa and aa.within(protocol.aa_tolerance) else None),
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


def hidden_discount(timing: dict[str, Any]) -> float:
    """What the billable figure is multiplied by for the hidden work the audit could not rule out:
    the candidate's timed sample against that sample plus the hidden-work interval's upper bound
    beyond the allowance (1.0 where the bound is inside it, or where no such figure was measured).

    The hidden-work judge rejects on the interval's lower bound, so a noisy audit (a loaded box)
    accepts whatever its wide interval cannot exclude: red team 15 (2026-12-06) saw 1 ms a sample
    of work before "ready" accepted in 2 of 13 `cpu-ci` rmsnorm audits, and audits billable with
    hidden-work intervals reaching 1-2.5 ms either side of zero on samples of about 6 ms. Billed as
    if the upper bound's excess had been timed, such an audit bills what it proves; a quiet
    audit's interval sits inside the allowance and loses nothing."""
    hidden, allowed, timed = (timing.get(name) for name in ("hidden_work_s", "hidden_work_allowed_s", "hidden_work_timed_s"))
    if not hidden or allowed is None or not timed or hidden[2] is None or not math.isfinite(hidden[2]):
        return 1.0
    return timed / (timed + max(0.0, hidden[2] - allowed))


def _clean(value: Any) -> Any:
    """JSON has no Inf/NaN: replace them with None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def error_entry(spec: WorkloadSpec, source: str, impl: str, protocol: Protocol, seed: int, message: str) -> dict[str, Any]:
    outcome = Outcome(spec=spec, verdict="error")
    outcome.reasons.append(Reason("harness.error", message[:2000]))
    return entry(outcome, source=source, impl=impl, protocol=protocol, seed=seed, peaks=None)


