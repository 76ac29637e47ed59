"""Output checks: reason codes, the tolerance rule, and the checks on what a candidate returned.

Judging happens in the parent on data it received; the `inspect_*` helpers run in the child and
only produce evidence for clearer reason codes (a hostile child can lie; the parent never relies on them alone).
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

# Every code a result may carry, with what it means. Keep codes stable: reports and billing
# refer to them.
REASON_CODES: dict[str, str] = {
    "correctness.mismatch": "an output differs from the float64 reference beyond tolerance",
    "correctness.nonfinite": "an output holds NaN or Inf where the reference is finite",
    "correctness.all_zero": "an output is all zeros while the reference is not",
    "correctness.output_type": "an output is not exactly a torch.Tensor (subclass, wrapper or wrong container)",
    "correctness.shape": "an output has the wrong shape or number of outputs",
    "correctness.dtype": "an output has the wrong dtype",
    "correctness.device": "an output is on the wrong device",
    "correctness.nondeterministic": "two calls on the same inputs disagree beyond tolerance",
    "correctness.timed_output_mismatch": "an output of a timed call, sampled after timing, is wrong",
    "correctness.revalidation_failed": "outputs on fresh inputs after timing are wrong",
    "integrity.input_mutated": "the candidate changed its inputs",
    "integrity.output_aliases_input": "an output shares memory with an input",
    "integrity.thread_left_running": "a thread started during a call was still running after it returned",
    "integrity.background_cpu": "the candidate used CPU outside its timed windows",
    "integrity.unbilled_call_slow": "a model's unbilled first decode call took far longer than the trusted workers' (work for the next call's input hidden there)",
    "integrity.commitment_mismatch": "outputs changed after timing stopped (lazy or deferred work)",
    "integrity.stray_process": "the candidate left processes running",
    "integrity.cpus_widened": "the candidate let itself run on cores outside the measurement cores",
    "integrity.slows_next_arm": "the trusted arm measured right after the candidate ran slower than the one that was not",
    "integrity.interrupts_in_other_arms": "the measurement cores took more interrupts while the trusted workers ran than while the candidate did (timers, sleeping threads or I/O left to the kernel)",
    "timing.clock_mismatch": "the child's reported timing disagrees with the parent's clock or CPU accounting",
    "timing.caching_suspected": "identical inputs run much faster than distinct ones",
    "timing.done_before_computed": "a timed call was reported done before its outputs were computed (read at that moment, they differ from what the worker later held)",
    "timing.snapshot_stalled": "reads of outputs reported done had to wait on the candidate, which chose when they went through",
    "timing.below_physical_floor": "faster than the device's bandwidth and FLOP/s allow",
    "sandbox.timeout": "the candidate did not answer within its time limit",
    "sandbox.crash": "the candidate process died from a signal",
    "sandbox.exit": "the candidate process exited",
    "sandbox.memory_limit": "the candidate exceeded its memory limit",
    "sandbox.cpu_limit": "the candidate exceeded its CPU time limit",
    "sandbox.import_error": "the candidate module failed to import",
    "sandbox.no_kernel": "the candidate module defines no callable `kernel`",
    "sandbox.candidate_exception": "the candidate raised an exception",
    "sandbox.protocol": "the candidate process sent a malformed message",
    "harness.error": "the harness itself failed (not the candidate's fault)",
    "model.no_end_to_end": "the whole-model (end-to-end) audit did not run or measured no phase: no model figure bills",
    "model.rejected_end_to_end": "a phase of the whole-model (end-to-end) audit was not accepted: no model figure bills",
}


@dataclass(frozen=True)
class Reason:
    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in REASON_CODES:
            raise ValueError(f"unregistered reason code {self.code!r}; add it to REASON_CODES")

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one output tensor with its reference."""

    passed: bool
    max_abs_err: float
    max_rel_err: float
    worst_ratio: float  # max |out - ref| / allowed; <= 1 passes
    failed_fraction: float
    nonfinite: bool
    all_zero: bool


def compare_tensors(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    mask: torch.Tensor | None = None,
) -> Comparison:
    """Elementwise |out - ref| <= atol * rms_row(ref) + rtol * |ref| + tiny over the kept elements.

    rms_row is the reference's root mean square along the last dimension (one row), so a row of
    outlier tokens is judged on its own scale; tiny is the smallest normal number of the output
    dtype, below which float16 cannot represent a difference. Non-finite reference elements must
    be matched exactly; non-finite outputs where the reference is finite fail.
    """
    out64 = out.detach().to(device=ref.device, dtype=torch.float64)
    ref64 = ref.detach().to(torch.float64)
    keep = torch.ones_like(ref64, dtype=torch.bool) if mask is None else mask.to(ref64.device)
    ref_finite = torch.isfinite(ref64)
    out_finite = torch.isfinite(out64)
    nonfinite = bool((keep & ref_finite & ~out_finite).any())
    special_ok = bool(
        torch.equal(
            torch.nan_to_num(out64[keep & ~ref_finite], nan=0.5, posinf=1.0, neginf=-1.0),
            torch.nan_to_num(ref64[keep & ~ref_finite], nan=0.5, posinf=1.0, neginf=-1.0),
        )
    )
    checked = keep & ref_finite & out_finite
    finite_ref = torch.where(keep & ref_finite, ref64, torch.zeros((), dtype=torch.float64, device=ref64.device))
    if ref64.dim() == 0:
        row_rms = finite_ref.abs()
    else:
        counts = (keep & ref_finite).sum(dim=-1, keepdim=True).clamp_min(1)
        row_rms = (finite_ref.square().sum(dim=-1, keepdim=True) / counts).sqrt().expand_as(ref64)
    tiny = torch.finfo(out.dtype).tiny if out.is_floating_point() else 0.0
    ref_c, out_c = ref64[checked], out64[checked]
    all_zero = bool(out64.numel() > 0 and not out64.any() and ref64[ref_finite].any())
    if ref_c.numel() == 0:
        return Comparison(
            passed=not nonfinite and special_ok,
            max_abs_err=0.0,
            max_rel_err=0.0,
            worst_ratio=0.0,
            failed_fraction=0.0,
            nonfinite=nonfinite,
            all_zero=all_zero,
        )
    err = (out_c - ref_c).abs()
    allowed = atol * row_rms[checked] + rtol * ref_c.abs() + tiny
    # A reference row that is exactly zero allows nothing; keep the ratio finite.
    allowed = allowed.clamp_min(torch.finfo(torch.float64).tiny)
    ratio = err / allowed
    failed = ratio > 1.0
    ref_max = float(ref_c.abs().max())
    return Comparison(
        passed=not nonfinite and special_ok and not bool(failed.any()),
        max_abs_err=float(err.max()),
        max_rel_err=float(err.max()) / ref_max if ref_max else float(err.max()),
        worst_ratio=float(ratio.max()),
        failed_fraction=float(failed.sum()) / float(keep.sum().clamp_min(1)),
        nonfinite=nonfinite,
        all_zero=all_zero,
    )


@dataclass
class Judgement:
    """What the parent concluded about a set of outputs."""

    reasons: list[Reason] = field(default_factory=list)
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.reasons

    def merge(self, other: Judgement) -> None:
        self.reasons.extend(r for r in other.reasons if r not in self.reasons)
        self.max_abs_err = max(self.max_abs_err, other.max_abs_err)
        self.max_rel_err = max(self.max_rel_err, other.max_rel_err)


def check_output_meta(
    meta: Sequence[dict[str, Any]] | None,
    *,
    expected_shapes: Sequence[tuple[int, ...]],
    dtype: str,
    device_type: str,
    where: str,
) -> list[Reason]:
    """Check the child's description of the outputs against what the workload must return."""
    if meta is None:
        return [Reason("correctness.output_type", f"{where}: kernel returned no tensor output")]
    reasons: list[Reason] = []
    if len(meta) != len(expected_shapes):
        return [Reason("correctness.shape", f"{where}: expected {len(expected_shapes)} output(s), got {len(meta)}")]
    for index, (item, shape) in enumerate(zip(meta, expected_shapes)):
        label = f"{where}, output {index}"
        if not item.get("exact_tensor"):
            reasons.append(
                Reason("correctness.output_type", f"{label}: returned {item.get('type')!r}, must be exactly torch.Tensor")
            )
            continue
        if tuple(item.get("shape", ())) != tuple(shape):
            reasons.append(Reason("correctness.shape", f"{label}: shape {item.get('shape')} != expected {list(shape)}"))
        if item.get("dtype") != dtype:
            reasons.append(Reason("correctness.dtype", f"{label}: dtype {item.get('dtype')} != expected {dtype}"))
        if item.get("device_type") != device_type:
            reasons.append(
                Reason("correctness.device", f"{label}: on {item.get('device_type')}, expected {device_type}")
            )
        if item.get("aliases_input"):
            reasons.append(Reason("integrity.output_aliases_input", f"{label}: shares storage with an input"))
    return reasons


def judge_outputs(
    outputs: Sequence[torch.Tensor],
    refs: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor | None],
    *,
    atol: float,
    rtol: float,
    where: str,
    failure_code: str = "correctness.mismatch",
) -> Judgement:
    """Compare received outputs with references; `failure_code` names the phase for mismatches."""
    judgement = Judgement()
    for index, (out, ref, mask) in enumerate(zip(outputs, refs, masks)):
        label = f"{where}, output {index}"
        if tuple(out.shape) != tuple(ref.shape):
            judgement.reasons.append(Reason("correctness.shape", f"{label}: shape {list(out.shape)} != {list(ref.shape)}"))
            continue
        cmp = compare_tensors(out, ref, atol=atol, rtol=rtol, mask=mask)
        judgement.max_abs_err = max(judgement.max_abs_err, cmp.max_abs_err)
        judgement.max_rel_err = max(judgement.max_rel_err, cmp.max_rel_err)
        if cmp.passed:
            continue
        specific = cmp.all_zero or cmp.nonfinite
        if cmp.all_zero:
            judgement.reasons.append(Reason("correctness.all_zero", f"{label}: all zeros, reference is not"))
        elif cmp.nonfinite:
            judgement.reasons.append(Reason("correctness.nonfinite", f"{label}: NaN/Inf where the reference is finite"))
        # The phase code (timed, revalidation) is always added so a reader sees when it failed.
        if not specific or failure_code != "correctness.mismatch":
            judgement.reasons.append(
                Reason(
                    failure_code,
                    f"{label}: {cmp.failed_fraction:.2%} of elements out of tolerance, "
                    f"max abs err {cmp.max_abs_err:.3g}, worst err/allowed {cmp.worst_ratio:.3g}",
                )
            )
    return judgement


def judge_determinism(
    first: Sequence[torch.Tensor],
    second: Sequence[torch.Tensor],
    refs: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor | None],
    *,
    atol: float,
    rtol: float,
    where: str,
) -> list[Reason]:
    """Two calls on the same inputs must agree within the tolerance the reference allows."""
    for index, (a, b, ref, mask) in enumerate(zip(first, second, refs, masks)):
        if tuple(a.shape) != tuple(b.shape):
            return [Reason("correctness.nondeterministic", f"{where}, output {index}: shapes differ between calls")]
        # Measure the disagreement on the reference's scale, so the bound means the same as for
        # correctness; on the reference's device (a GPU audit's references stay on the GPU).
        diff = (a.to(device=ref.device, dtype=torch.float64) - b.to(device=ref.device, dtype=torch.float64)).abs()
        ref64 = ref.to(torch.float64)
        finite = torch.isfinite(ref64) & torch.isfinite(diff)
        if mask is not None:
            finite &= mask.to(diff.device)
        if not finite.any():
            continue
        scale = float(ref64[finite].square().mean().sqrt())
        allowed = atol * scale + rtol * ref64[finite].abs()
        if bool((diff[finite] > allowed).any()) or not bool(torch.isfinite(a).eq(torch.isfinite(b)).all()):
            return [
                Reason(
                    "correctness.nondeterministic",
                    f"{where}, output {index}: second call differs by up to {float(diff[finite].max()):.3g}",
                )
            ]
    return []


# --------------------------------------------------------------------------------------------
# Child-side evidence. These run next to the candidate and only make reasons clearer.


def tensor_digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()


def storage_spans(tensors: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """Address ranges of the storages behind `tensors` (inputs an output must not overlap)."""
    spans = []
    for tensor in tensors:
        if type(tensor) is torch.Tensor:
            storage = tensor.untyped_storage()
            spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return spans


def inspect_outputs(
    result: Any, input_spans: Sequence[tuple[int, int]], *, expect_tuple: bool
) -> tuple[list[torch.Tensor] | None, list[dict[str, Any]] | None]:
    """Flatten a kernel's return value into tensors plus a description the parent checks."""
    if expect_tuple:
        if not isinstance(result, (tuple, list)):
            return None, [{"exact_tensor": False, "type": type(result).__name__}]
        items = list(result)
    else:
        items = [result]
    meta: list[dict[str, Any]] = []
    exact_all = True
    for item in items:
        if type(item) is torch.Tensor and item.layout == torch.strided:
            start = item.data_ptr()
            end = start + item.numel() * item.element_size()
            meta.append(
                {
                    "exact_tensor": True,
                    "shape": list(item.shape),
                    "dtype": str(item.dtype)[6:],
                    "device_type": item.device.type,
                    "aliases_input": any(start < s_end and s_start < end for s_start, s_end in input_spans),
                }
            )
        else:
            exact_all = False
            meta.append({"exact_tensor": False, "type": f"{type(item).__module__}.{type(item).__qualname__}"})
    return (items if exact_all else None), meta


def python_threads() -> set[int]:
    """Identities of the live Python threads other than the current one."""
    current = threading.get_ident()
    return {t.ident for t in threading.enumerate() if t.ident is not None and t.ident != current}


def os_thread_count() -> int:
    return len(os.listdir("/proc/self/task"))
