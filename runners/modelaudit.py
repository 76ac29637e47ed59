"""The whole-model audit: the uploaded model's forward pass as transformers runs it (baseline) against
the same model with the optimization artifact applied (optimized), under the full protocol.

The parent's side (trusted; the worker it drives is runners/audit/model_worker.py, the inputs both
derive runners/audit/model_inputs.py): interleaved rounds of baseline, optimized and an A/A control
(a second baseline worker) on token ids the parent draws fresh every round, outputs of timed calls
checked against the baseline's, and a verdict per phase (`prefill`; `decode` where the model keeps
a key/value cache). The per-kernel audit (runners.evaluate) proves each workload; this proves the
whole model, including everything between the kernels that no workload covers.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runners import checks, measure, result, stats, suite
from runners.artifact import applier_source, artifact_document
from runners.audit.model_inputs import commit_weights
from runners.audit.model_sample import ModelSample, stepped_sample
from runners.audit.rounds import Interference, Round, bootstrap_args, interference_excess, judge_interrupts, judge_next_arm
from runners.audit.session import host_freezes
from runners.measure import Protocol
from runners.modelload import read_config
from runners.sandbox import Sandbox, SandboxConfig, SandboxError, Worker
from runners.checks import Reason


Progress = Callable[[float, str], None]

PHASES = ("prefill", "decode")
HANDLER = "runners.audit.model_worker:ModelRunner"

# Logit tolerance by the model's dtype: |optimized - baseline| <= atol x rms(baseline logit row)
# + rtol x |baseline| (checks.compare_tensors' rule), element by element. Looser than one kernel's
# tolerance because rounding differences compound over layers; a wrong model (a scaled norm, a
# skipped layer, stale cache) is off by a sizeable fraction of the row's scale, far above these.
FORWARD_TOLERANCE: dict[str, tuple[float, float]] = {
    "float32": (1e-3, 1e-3),
    "float16": (2e-2, 2e-2),
    "bfloat16": (5e-2, 5e-2),
}
# A forward pass is long next to a kernel call: a sample holds at most this many calls (decode's
# steps, after its prompt).
MAX_CALLS_PER_SAMPLE = 8
# A phase measures the protocol's rounds, and up to `model_rounds_factor` times more while they fit in
# PHASE_BUDGET_S (estimated from calibration): a forward pass of a small model is cheap, and its A/A
# interval narrows with the square root of the rounds (tiny llama, 2x64 on the 2-core VM: prefill
# A/A half-width 3.8% at 30 rounds, 1.3-2.9% at 90).
PHASE_BUDGET_S = 45.0
# Bytes of logits fetched per checked call and side; positions beyond that are sampled at random,
# chosen after the window closed, so a full-vocabulary model at long sequences stays cheap to check.
FETCH_BYTES = 8 << 20

# Reference points: the same model as something free to have would run it, measured in the same
# rounds (trusted code in a worker of its own, never billed): what the artifact adds over it.
REFERENCE_POINTS: dict[str, str] = {
    # The forward compiled in place with torch.compile's default settings: the module keeps its
    # class (generation, cache and config attributes), as a customer's torch.compile of the forward
    # would. (Until 2026-12-05 with dynamic=False, which recompiles decode at every cache length
    # until Dynamo's limit and then runs eager: a reference weaker than what is free to have.)
    "torch-compile": "import torch\n\ndef transform(model):\n    model.forward = torch.compile(model.forward)\n    return model\n",
}

METHOD = (
    "whole forward pass in sandboxed workers: eager transformers model (baseline) vs the same model with "
    "the optimization artifact applied, interleaved rounds in random order with an A/A control, fresh token "
    "ids every round, each call's inputs revealed in its own request and timed on the parent's clock up to the "
    "worker's commitment to its outputs, logits of timed calls checked against the baseline's and the "
    "commitments; speedup = median per-round "
    "ratio with a paired bootstrap 95% CI widened by the A/A deviation"
)


class ModelAuditError(RuntimeError):
    """The end-to-end audit could not run (a trusted worker failed, the model cannot be fed tokens)."""


# --------------------------------------------------------------------------------------------
# Parent side.


@dataclass
class _Slot:
    label: str  # baseline | optimized | aa
    worker: Worker


@dataclass
class _PhaseOutcome:
    phase: str
    verdict: str = "accepted"
    reasons: list[Reason] = field(default_factory=list)
    calls: int = 0
    max_abs_err: float = 0.0
    worst_ratio: float = 0.0
    checked: int = 0
    tolerance: tuple[float, float] | None = None
    slots: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    meanwhile: dict[str, list[float]] = field(default_factory=dict)  # CPU while other workers were measured
    frozen_between_samples: bool = False
    held_samples: list[bool] = field(default_factory=list)  # every measured sample of every arm: held between its calls
    after_reply_s: dict[str, list[float]] = field(default_factory=dict)  # per round: CPU from the last reply to the freeze
    # Per round: (unbilled steps' window, billed per-call time), seconds (_judge_unbilled_call)
    unbilled_s: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    unbilled_excess: list[float] | None = None  # [point, low, high] in the optimized model's billed calls
    # Per round, each arm's first window (s): decode's prompt; prefill's first call (the prompt's scale)
    first_window_s: dict[str, list[float]] = field(default_factory=dict)
    prompt: dict[str, Any] = field(default_factory=dict)  # the figures _judge_prompt judged
    first_tokens: int = 1  # decode: new tokens per batch entry in a sample's first call
    bill_from: int = 0  # the first billed call of a sample
    # Measured rounds as the round engine ran them: the arms' labels in the order they were timed,
    # and each arm's sample (what the optimized worker leaves behind for later windows is judged
    # from these: _judge_left_behind).
    measured_rounds: list[tuple[tuple[str, ...], dict[str, ModelSample]]] = field(default_factory=list)
    left_behind: dict[str, Any] = field(default_factory=dict)
    background: dict[str, Any] = field(default_factory=dict)  # the figures _judge_background judged

    def fail(self, reason: Reason, *, verdict: str = "rejected") -> None:
        if all(r.code != reason.code for r in self.reasons):  # one entry per code: the first says it
            self.reasons.append(reason)
        if self.verdict != "error":
            self.verdict = verdict


def _freezes(sandbox: Sandbox, device: str) -> bool:
    """Whether waiting arms are frozen between their samples (as in kernel audits)."""
    return host_freezes(sandbox, device)


def _discounts(protocol: Protocol, worker: Worker, device: str) -> bool:
    """As in the per-kernel audit: on CPU with one thread per worker, that thread's run-queue wait
    is other processes' time and comes off the sample (runners.audit.model_sample)."""
    return protocol.discount_preemption and device == "cpu" and worker.sandbox.config.threads == 1


def _round_request(phase: str, seed: int, *, calls: int, vocab: int, batch: int, seq: int, commit_seed: int) -> dict[str, Any]:
    return {"phase": phase, "seed": seed, "calls": calls, "vocab": vocab, "batch": batch, "seq": seq,
            "commit_seed": commit_seed}


def _reveal(phase: str, rng: np.random.Generator, *, calls: int, vocab: int, batch: int, seq: int,
            first_tokens: int = 1) -> list[list[int]]:
    """What each call of a sample reads, each sent with its own `step` (runners.audit.model_sample):
    the set, then prefill's whole token window (batch x seq ids, row by row); for decode, the
    round's prompt (batch x seq ids, the sample's first call, timed and not billed: _judge_prompt),
    then `calls` steps of new tokens per batch entry: `first_tokens` with the first, one with each
    later one."""
    if phase == "prefill":
        return [[call, *(int(t) for t in rng.integers(0, vocab, size=batch * seq))] for call in range(calls)]
    # Decode: every step extends the round's one prompt (set 0) by the tokens revealed with it.
    prompt = [0, *(int(t) for t in rng.integers(0, vocab, size=batch * seq))]
    return [prompt] + [[0, *(int(t) for t in rng.integers(0, vocab, size=batch * (first_tokens if call == 0 else 1)))]
                       for call in range(calls)]


def _prompt_calls(phase: str) -> int:
    """Calls at the head of a sample before its first step: decode's prompt prefill (one)."""
    return 1 if phase == "decode" else 0


def _decode_bills_from(phase: str, first_tokens: int) -> int:
    """The first billed step of a sample, counted after decode's prompt. Decode's first step over a
    recurrent state carries one token on the prompt's state, whose every continuation a worker
    could tabulate (a vocabulary of rows): it is timed and judged (`_judge_unbilled_call`), not
    billed. Over a key/value cache the first step carries two tokens and every step is billed."""
    return 1 if phase == "decode" and first_tokens < 2 else 0


def audit_model_forward(
    model_dir: Path,
    artifact: Any,
    *,
    batch: int,
    seq: int,
    device: str,
    profile: str,
    seed: int,
    progress: Progress | None = None,
    protocol: Protocol | None = None,
    rounds: int | None = None,
    sandbox_config: SandboxConfig | None = None,
    phases: tuple[str, ...] = PHASES,
    transform_source: str | None = None,
    reference_points: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Measure the model's forward pass, eager against `artifact` applied, phase by phase.

    `artifact` is an optimization artifact (its JSON dict, or an object with `to_dict()`), applied in
    the optimized worker by the applier it names (runners.artifact; the judge never imports the
    optimizer), or None (the optimized side then runs the model as is: an A/B/A of identical models). Each phase gets baseline, optimized and A/A
    workers' samples over `protocol.rounds` measured rounds, up to `protocol.model_rounds_factor` times
    more where they fit in PHASE_BUDGET_S (exactly `rounds` where given), a verdict (`accepted`,
    `rejected` with reason codes, `error`, or `skipped` with a note) and, when accepted, the speedup
    with its CI. `transform_source` is for the harness's own tests only: Python source defining
    `transform(model)`, run in the optimized worker after the artifact, to build a wrong model.
    `phases` narrows what is measured (a phase left out is listed as skipped). `reference_points`
    (default: the protocol's `model_reference_points`) names REFERENCE_POINTS measured beside them.

    Raises ModelAuditError when a trusted worker fails, ValueError for arguments that cannot work.
    """
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise ValueError(f"unknown phase(s) {unknown}; use {', '.join(PHASES)}")
    references = tuple(reference_points if reference_points is not None
                       else (protocol or measure.protocol_for(profile)).model_reference_points)
    if set(references) - set(REFERENCE_POINTS):
        raise ValueError(f"unknown reference point(s) {sorted(set(references) - set(REFERENCE_POINTS))}; "
                         f"use {', '.join(REFERENCE_POINTS)}")
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be at least 1 (got batch={batch}, seq={seq})")
    protocol = protocol or measure.protocol_for(profile)
    if rounds is not None:
        protocol = replace(protocol, rounds=max(1, int(rounds)))
    extend = rounds is None
    model_dir = Path(model_dir).resolve()
    config = read_config(model_dir)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text_config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"{config.model_type} config has no vocab_size: the end-to-end audit feeds token ids")
    positions = next((getattr(text_config, k) for k in ("max_position_embeddings", "n_positions")
                      if isinstance(getattr(text_config, k, None), int)), None)
    if positions is not None and seq > positions:
        raise ValueError(f"seq {seq} exceeds the model's {positions} positions; audit a shorter sequence")
    artifact_dict = _artifact_dict(artifact)
    note = progress or (lambda fraction, message: None)
    started = time.monotonic()
    base_config = sandbox_config or SandboxConfig(device=device)
    entries: list[dict[str, Any]] = []
    notes: list[str] = []
    with _readable_copy(model_dir) as model_dir, measure.harness_threads(), Sandbox(replace(
        base_config, device=device, threads=protocol.worker_threads(),
        extra_read_roots=(*base_config.extra_read_roots, str(model_dir)), worker_handler=HANDLER,
    )) as sandbox:
        note(0.0, "end to end: loading the model in baseline, optimized and A/A workers")
        try:
            slots = {label: _Slot(label, sandbox.spawn(role)) for label, role in
                     (("baseline", "baseline"), ("optimized", "candidate"), ("aa", "baseline"))}
        except SandboxError as exc:
            raise ModelAuditError(f"could not start the model workers: {exc} {exc.detail[-1500:]}") from exc
        load_timeout = protocol.first_call_timeout_s
        info = _load_trusted(slots["baseline"].worker, model_dir, load_timeout)
        optimized_failure: SandboxError | None = None
        try:
            # Called as the trusted baseline calls the unmodified model, whatever its own signature says.
            slots["optimized"].worker.call("load", timeout=load_timeout, model_dir=str(model_dir),
                                           apply=applier_source(artifact_dict) if artifact_dict else None,
                                           transform=transform_source, convention=info.get("convention"))
        except SandboxError as exc:
            optimized_failure = exc
        _load_trusted(slots["aa"].worker, model_dir, load_timeout)
        for name in references:
            try:
                worker = sandbox.spawn("reference")
                slots[f"ref:{name}"] = _Slot(f"ref:{name}", worker)
                worker.call("load", timeout=load_timeout, model_dir=str(model_dir), apply=None, transform=REFERENCE_POINTS[name],
                            convention=info.get("convention"))
            except SandboxError as exc:  # a reference point that cannot run is left out, said why
                slots.pop(f"ref:{name}", None)
                notes.append(f"reference point {name} left out: {exc.message}"[:500])
        skip: dict[str, str] = {p: "not requested" for p in PHASES if p not in phases}
        if "decode" not in skip and not info.get("decode"):
            skip["decode"] = str(info.get("decode_note"))
        elif "decode" not in skip and positions is not None and seq + 1 > positions:
            skip["decode"] = f"a cache of {seq} tokens leaves no position for one more in this model's {positions}"
        notes.extend(f"{p} not audited: {why}" for p, why in skip.items())
        wanted = [p for p in PHASES if p not in skip]
        # Each arm's prefill figures once prefill is accepted (decode's prompt is judged against them):
        # "first", the median of its samples' first calls (as cold as the prompt); "all", of its per-call time.
        prefill_speed: dict[str, dict[str, float]] | None = None
        for phase in PHASES:
            if phase in skip:
                entries.append(_skipped(phase, skip[phase]))
                continue
            index = wanted.index(phase)
            outcome = _PhaseOutcome(phase)
            if optimized_failure is not None:
                _errored(outcome, optimized_failure)
            else:
                span = (0.05 + 0.9 * index / len(wanted), 0.05 + 0.9 * (index + 1) / len(wanted))
                try:
                    _audit_phase(outcome, sandbox, slots, protocol, phase=phase, vocab=vocab, batch=batch, seq=seq,
                                 device=device, seed=suite.derive_seed(seed, "model-forward", phase), extend=extend,
                                 progress=lambda f, m, s=span: note(s[0] + (s[1] - s[0]) * f, m),
                                 first_tokens=int(info.get("first_step_tokens") or 1), prefill_speed=prefill_speed)
                except ModelAuditError as exc:  # this phase cannot be judged; the other may still be
                    outcome.fail(Reason("harness.error", str(exc)[:2000]), verdict="error")
                failure = slots["optimized"].worker.failure
                if failure is not None:
                    optimized_failure = failure
                if phase == "prefill" and outcome.verdict == "accepted":
                    prefill_speed = {
                        "first": {label: stats.median(v) for label, v in outcome.first_window_s.items() if v},
                        "all": {label: stats.median(v) for label, v in outcome.slots.items() if v}}
            entries.append(_entry(outcome, protocol, batch=batch, seq=seq, seed=seed))
        for slot in slots.values():
            slot.worker.close()
        sandbox_info = sandbox.info()
    note(1.0, "end to end: " + ", ".join(f"{p['phase']} {p['verdict']}" for p in entries))
    return {
        "method": METHOD,
        "shape": {"batch": batch, "seq": seq},
        "device": device,
        "profile": profile,
        "model_class": info.get("model_class"),
        "dtype": info.get("dtype"),
        "artifact_strategy": (artifact_dict or {}).get("strategy", "none"),
        "protocol": {"name": protocol.name, "rounds": protocol.rounds, "warmup_rounds": protocol.warmup_rounds,
                     "rounds_up_to": protocol.rounds * protocol.model_rounds_factor if extend else protocol.rounds,
                     "aa_tolerance": protocol.aa_tolerance, "threads": protocol.worker_threads(),
                     "discount_preemption": protocol.discount_preemption and device == "cpu" and protocol.worker_threads() == 1,
                     "target_sample_s": _model_target_s(protocol)},
        "reference_points": list(references),
        "sandbox": {"user": sandbox_info.get("user"), "landlock_abi": sandbox_info.get("landlock_abi"),
                    "protections": sandbox_info.get("protections"), "complete": sandbox_info.get("complete")},
        "phases": entries,
        "notes": notes,
        "seconds": time.monotonic() - started,
    }


def _artifact_dict(artifact: Any) -> dict[str, Any] | None:
    """The artifact as the worker receives it (JSON), refused early when it is not one."""
    return artifact_document(artifact)


@contextlib.contextmanager
def _readable_copy(model_dir: Path) -> Iterator[Path]:
    """Workers run as an unprivileged uid, which may not read the runner's copy of a model (files
    private to the runner): when the harness runs as root they read a copy made readable to them,
    removed afterwards (copied in the kernel: seconds for a few GB)."""
    if os.geteuid() != 0:
        yield model_dir
        return
    stage = Path(tempfile.mkdtemp(prefix="dyno-model-"))
    try:
        os.chmod(stage, 0o755)
        target = stage / model_dir.name
        shutil.copytree(model_dir, target, symlinks=False, copy_function=shutil.copyfile)
        for root, _, files in os.walk(target):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        yield target
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _load_trusted(worker: Worker, model_dir: Path, timeout: float) -> dict[str, Any]:
    try:
        return worker.call("load", timeout=timeout, model_dir=str(model_dir), apply=None, transform=None,
                           probe_decode=True).header
    except SandboxError as exc:
        raise ModelAuditError(f"the baseline model failed to load in its worker: {exc} {exc.detail[-1500:]}") from exc


def _skipped(phase: str, why: str) -> dict[str, Any]:
    return {"phase": phase, "verdict": "skipped", "reasons": [], "note": why, "speedup": None, "ci95": None,
            "aa": {"speedup": None, "ci95": None, "stable": None}, "baseline_median_s": None,
            "optimized_median_s": None, "rounds": 0, "billable": False}


def _errored(outcome: _PhaseOutcome, exc: SandboxError) -> None:
    # As in the per-kernel audit: a worker that refused what the optimized side did (integrity.*)
    # judged it; any other failure means it could not be judged.
    code = exc.code if exc.code in checks.REASON_CODES else "sandbox.protocol"
    tail = " / ".join(line.strip() for line in exc.detail.strip().splitlines()[-2:])
    outcome.fail(Reason(code, f"{exc.message}{' | ' + tail[-500:] if tail else ''}"),
                 verdict="rejected" if code.startswith("integrity.") else "error")


def _model_target_s(protocol: Protocol) -> float:
    return protocol.model_target_sample_s or protocol.target_sample_s


def _calibrate(worker: Worker, protocol: Protocol, *, phase: str, vocab: int, batch: int, seq: int,
               seed: int, device: str, first_tokens: int) -> tuple[int, float, float]:
    """Calls (decode: steps) per sample so that the baseline's sample lasts about
    `target_sample_s`, the baseline's per-call time, and its time for the calls before them
    (decode's prompt)."""
    timeout = protocol.first_call_timeout_s
    discount = _discounts(protocol, worker, device)
    head = _prompt_calls(phase)
    worker.call("prepare", timeout=timeout, **_round_request(phase, suite.derive_seed(seed, "calibrate"), calls=3 + head,
                                                             vocab=vocab, batch=batch, seq=seq, commit_seed=0))
    reveal = _reveal(phase, np.random.default_rng(suite.derive_seed(seed, "calibrate-reveal")), calls=3, vocab=vocab,
                     batch=batch, seq=seq, first_tokens=first_tokens)
    freeze = _freezes(worker.sandbox, device)
    # One sample: decode's prompt (if any) and the first call warm up, the last two calls are timed.
    record = stepped_sample(worker, reveal, timeout=timeout, discount=discount, bill_from=head + 1, freeze=freeze)
    per_call, head_s = record.per_call_s, sum(record.windows_ns[:head]) / 1e9
    worker.call("release", timeout=timeout)
    calls = max(1, min(MAX_CALLS_PER_SAMPLE, protocol.max_calls, math.ceil(_model_target_s(protocol) / per_call)))
    # A sample that does not bill its first step has at least two, and one more for the one it does not bill.
    if _decode_bills_from(phase, first_tokens):
        calls = max(2, calls + 1)
    return calls, per_call, head_s


def _audit_phase(outcome: _PhaseOutcome, sandbox: Sandbox, slots: dict[str, _Slot], protocol: Protocol, *, phase: str,
                 vocab: int, batch: int, seq: int, device: str, seed: int, progress: Progress, extend: bool = False,
                 first_tokens: int = 1, prefill_speed: dict[str, dict[str, float]] | None = None) -> None:
    """Calibrate on the baseline, then interleaved rounds; stops at the first round that rejects.
    `prefill_speed`: each arm's medians in this audit's prefill phase, of its samples' first
    calls and of its per-call time (decode's prompt is judged against them: _judge_prompt)."""
    optimized = slots["optimized"].worker
    workers = [slot.worker for slot in slots.values()]
    try:
        progress(0.0, f"end to end {phase}: calibrating")
        first_tokens = first_tokens if phase == "decode" else 1
        calls, per_call, head_s = _calibrate(slots["baseline"].worker, protocol, phase=phase, vocab=vocab,
                                             batch=batch, seq=seq, seed=seed, device=device, first_tokens=first_tokens)
        outcome.calls, outcome.first_tokens = calls, first_tokens
        head = _prompt_calls(phase)
        outcome.bill_from = _decode_bills_from(phase, first_tokens)
        bill_from = head + outcome.bill_from  # within the sample, whose first `head` calls are the prompt
        timeout = max(protocol.call_timeout_floor_s, protocol.call_timeout_factor * (per_call * calls + head_s))
        # Everything a worker could precompute or time its behaviour by (the arms' order, each
        # round's tokens, what each call reveals, the commitment weights) and which calls and
        # positions are verified are drawn from the OS, never from the audit seed: a seed can be
        # known to the vendor (a reproduction of a published report runs with its seed). The seed
        # fixes calibration and the bootstrap only.
        # Where the host freezes a whole tree (CPU with the freezer cgroup, as for kernel audits),
        # every arm is stopped (SIGSTOP, then the freezer) from its prepare to its sample and again
        # from its sample to its next request: nothing of a waiting worker, no thread and no timer,
        # runs while another arm is measured. Without a freezer, CPU in others' windows is judged.
        freezes = _freezes(sandbox, device)
        outcome.frozen_between_samples = freezes
        order_rng = np.random.default_rng(secrets.randbits(128))
        check_rng = np.random.default_rng(secrets.randbits(128))
        reveal_rng = np.random.default_rng(secrets.randbits(128))
        ledger = measure.CpuLedger()
        ordered = list(slots.values())
        samples: dict[str, list[float]] = {slot.label: [] for slot in ordered}
        interference = Interference([slot.label for slot in ordered])  # CPU during others' windows, per round
        engine: Round[_Slot, ModelSample] = Round(
            ordered, order=order_rng, interference=interference,
            settle=lambda: measure.settle(workers, max_wait_s=protocol.settle_max_s))
        total = protocol.warmup_rounds + (_phase_rounds(protocol, calls * per_call + head_s) if extend else protocol.rounds)
        for round_index in range(total):
            measured = round_index >= protocol.warmup_rounds
            # Warm-up rounds hold the optimized side's first calls, which may compile.
            limit = timeout if measured else protocol.first_call_timeout_s + timeout
            progress(round_index / total, f"end to end {phase}: round {round_index + 1}/{total}")
            commit_seed = secrets.randbits(63)
            request = _round_request(phase, secrets.randbits(63), calls=head + calls, vocab=vocab,
                                     batch=batch, seq=seq, commit_seed=commit_seed)
            ledger.next_round()

            def step(slot: _Slot, action: Callable[[], Any]) -> Any:
                """Run `action` for `slot`; a reference point that fails is left out of the phase."""
                try:
                    return action()
                except SandboxError as exc:
                    if not slot.label.startswith("ref:"):
                        raise
                    ordered.remove(slot)
                    workers.remove(slot.worker)
                    samples.pop(slot.label, None)
                    records.pop(slot.label, None)
                    outcome.notes.append(f"reference point {slot.label[4:]} left out of {phase}: {exc.message}"[:500])
                    return None

            def prepare(slot: _Slot) -> None:
                ledger.enter(slot.worker, "prepare")
                slot.worker.call("prepare", timeout=limit, **request)
                if freezes:
                    # Stopped at once: nothing it started while preparing runs on while the next
                    # arm prepares (a red team's thread built a next-token table there, 2026-12-05).
                    slot.worker.freeze()
                ledger.enter(slot.worker, "idle")

            def sample(slot: _Slot) -> ModelSample:
                ledger.enter(slot.worker, "window")
                # Frozen inside, before its CPU is read (runners.audit.model_sample.stepped_sample),
                # until its next request (the round's checks) thaws it.
                record = stepped_sample(slot.worker, offsets, timeout=limit, discount=_discounts(protocol, slot.worker, device),
                                        bill_from=bill_from, freeze=freezes)
                ledger.enter(slot.worker, "idle")
                # After its last reply the worker is as idle as it will be until its next request.
                ledger.move(slot.worker, record.after_reply_ns, "window", "idle")
                return record

            records: dict[str, ModelSample] = {}
            for slot in list(ordered):
                step(slot, lambda slot=slot: prepare(slot))
            offsets = _reveal(phase, reveal_rng, calls=calls, vocab=vocab, batch=batch, seq=seq, first_tokens=first_tokens)
            records.update(engine.run(lambda slot: step(slot, lambda: sample(slot))))
            _check_round(outcome, slots, records, protocol, round_index=round_index, rng=check_rng, calls=head + calls,
                         batch=batch, commit_seed=commit_seed, device=device, timeout=limit, compare_aa=round_index == 0)
            def release(slot: _Slot) -> None:
                # Booked apart (and judged with idle): what dropping the round's outputs and caches
                # costs, which the idle rule counts as work outside the windows.
                ledger.enter(slot.worker, "release")
                slot.worker.call("release", timeout=limit)
                ledger.enter(slot.worker, "idle")

            for slot in list(ordered):
                step(slot, lambda slot=slot: release(slot))
                if freezes and slot in ordered:
                    step(slot, slot.worker.freeze)  # until the next round's prepare
            if outcome.verdict != "accepted":
                break  # a wrong or misbehaving model is not timed any further
            if measured:
                outcome.measured_rounds.append((tuple(engine.measured), dict(records)))
                for label, record in records.items():
                    samples[label].append(record.per_call_s)
                    outcome.held_samples.append(record.held)
                    outcome.after_reply_s.setdefault(label, []).append(record.after_reply_ns / 1e9)
                    # Decode: the prompt's window; prefill: the sample's first call's, as cold as decode's prompt
                    first = sum(record.windows_ns[:head]) if head else (record.windows_ns[0] if record.windows_ns else 0)
                    outcome.first_window_s.setdefault(label, []).append(first / 1e9)
                    unbilled = sum(record.windows_ns[head:bill_from])
                    if unbilled:
                        outcome.unbilled_s.setdefault(label, []).append((unbilled / 1e9, record.per_call_s))
        for slot in ordered:
            ledger.enter(slot.worker, "idle")
        outcome.slots = samples
        outcome.meanwhile = {label: values[protocol.warmup_rounds:] for label, values in interference.per_round.items()
                             if label in samples}
        if outcome.verdict == "accepted":
            _judge_background(outcome, slots, ledger, protocol, warmup=protocol.warmup_rounds, seed=seed)
        if outcome.verdict == "accepted":
            _judge_left_behind(outcome, protocol, seed=seed)
        if outcome.verdict == "accepted":
            _judge_unbilled_call(outcome, protocol, seed=seed)
        if outcome.verdict == "accepted" and head:
            _judge_prompt(outcome, protocol, prefill_speed, seed=seed)
    except SandboxError as exc:
        if optimized.failure is exc:
            _errored(outcome, exc)
            return
        raise ModelAuditError(f"a baseline worker failed during the {phase} audit: {exc} {exc.detail[-1500:]}") from exc
    stray = sandbox.strays()
    if stray:
        outcome.fail(Reason("integrity.stray_process", f"killed {len(stray)} process(es) left running during {phase}: {stray}"))


def _phase_rounds(protocol: Protocol, sample_s: float) -> int:
    """Measured rounds for a phase whose baseline sample lasts `sample_s`: a round costs three
    samples and about as much again in preparing, checking and settling."""
    affordable = int(PHASE_BUDGET_S / max(6 * sample_s, 1e-6))
    return max(protocol.rounds, min(protocol.model_rounds_factor * protocol.rounds, affordable))


# The bootstrap bound of a median over one or two rounds is their minimum: one busy stretch of a
# loaded box in both rounds rejected an eager model against itself (a 2-round test in CI). Every
# profile measures 15 rounds or more; only shortened test audits measure fewer than this.
_MIN_JUDGED_ROUNDS = 3


def _ratio_and_excess(mine: Sequence[float], theirs: Sequence[float], protocol: Protocol, *,
                      seed: int) -> tuple[stats.Estimate, float]:
    """Round by round, the optimized arm's figure against the trusted one's: a bootstrap CI of the
    median ratio and the median excess in seconds (a judge asks both to be past its allowances: a
    ratio alone would reject tiny absolute differences, an excess alone a large model's noise)."""
    ratio = stats.median_ci([m / max(t, 1e-9) for m, t in zip(mine, theirs)], seed=seed & 0xFFFFFFFF, **bootstrap_args(protocol))
    return ratio, stats.median([m - t for m, t in zip(mine, theirs)])


def _judge_background(outcome: _PhaseOutcome, slots: dict[str, _Slot], ledger: measure.CpuLedger, protocol: Protocol,
                      *, warmup: int, seed: int) -> None:
    """CPU the optimized worker used outside its windows, round by round against the two trusted
    workers (the per-kernel audit's rule, runners.audit.kernel.judge_timing): while other workers
    were measured (`interference_abs_s`: after settling, a waiting worker is blocked), while it
    should be idle (work between windows), and while it prepared the round. Prefill's `prepare` knows no
    tokens (each window comes with its own request). Decode's runs the optimized model's own
    prefill of the round's prompt, which an optimized model runs faster, not slower; a table of
    next-token outputs built there can only serve the unbilled first call. Both are held to
    `prepare_cpu_slack` over the trusted workers.
    Judged by the lower bound of a bootstrap CI of the median."""
    measured = slice(warmup, None)
    optimized = slots["optimized"].worker
    trusted = [slots["baseline"].worker, slots["aa"].worker]
    idle_c = ledger.per_round(optimized, "idle", "release")[measured]
    prep_c = ledger.per_round(optimized, "prepare")[measured]
    window_c = ledger.per_round(optimized, "window")[measured]
    idle_t = [sum(v) / len(v) for v in zip(*(ledger.per_round(w, "idle", "release")[measured] for w in trusted))]
    release_c = ledger.per_round(optimized, "release")[measured]
    release_t = [sum(v) / len(v) for v in zip(*(ledger.per_round(w, "release")[measured] for w in trusted))]
    prep_t = [sum(v) / len(v) for v in zip(*(ledger.per_round(w, "prepare")[measured] for w in trusted))]
    if not idle_c or len(idle_t) != len(idle_c) or len(prep_t) != len(prep_c):
        return
    if len(idle_c) < _MIN_JUDGED_ROUNDS:
        return
    options = bootstrap_args(protocol)
    excess = interference_excess(outcome.meanwhile.get("optimized") or [],
                                 [outcome.meanwhile.get(label) or [] for label in ("baseline", "aa")])
    if excess is not None:
        outcome.background["while_others_measured_s"] = excess
        outcome.background["while_others_measured_allowed_s"] = protocol.interference_abs_s
        if excess > protocol.interference_abs_s:
            outcome.fail(Reason("integrity.background_cpu", f"{outcome.phase}: the optimized model's worker used {excess * 1e3:.2f} ms "
                                                            "more CPU per round than trusted workers while other workers were measured "
                                                            f"on the same cores ({protocol.interference_abs_s * 1e3:.2f} ms allowed)"))
            return
    idle = stats.median_ci([c - t for c, t in zip(idle_c, idle_t)], seed=suite.derive_seed(seed, "idle") & 0xFFFFFFFF, **options)
    idle_allowed = protocol.background_cpu_abs_s + protocol.background_cpu_rel * stats.median(window_c)
    outcome.background["idle_s"] = [idle.point, idle.low, idle.high]
    # Of which, the median excess in the release of the round's outputs and caches (a diagnostic:
    # an honest compiled mamba at 8x512 was refused for 2.3 ms of idle CPU a round, 2026-12-06).
    if release_c and len(release_t) == len(release_c):
        outcome.background["release_s"] = stats.median([c - t for c, t in zip(release_c, release_t)])
    outcome.background["idle_allowed_s"] = idle_allowed
    if idle.low > idle_allowed:
        outcome.fail(Reason("integrity.background_cpu", f"{outcome.phase}: the optimized model's worker used {idle.point * 1e3:.1f} ms "
                                                        "more CPU per round than trusted workers while it should have been idle"))
        return
    ratio, extra = _ratio_and_excess(prep_c, prep_t, protocol, seed=suite.derive_seed(seed, "prepare"))
    outcome.background["prepare_ratio"] = [ratio.point, ratio.low, ratio.high]
    outcome.background["prepare_extra_s"] = extra
    outcome.background["prepare_extra_allowed_s"] = idle_allowed
    if ratio.low > 1.0 + protocol.prepare_cpu_slack and extra > idle_allowed:
        what = "preparing tokens" if outcome.phase == "prefill" else "prefilling the prompts' caches"
        outcome.fail(Reason("integrity.background_cpu", f"{outcome.phase}: {what} cost the optimized model's worker "
                                                        f"{ratio.point:.2f}x the CPU it cost trusted workers (work hidden before its windows)"))


def _judge_left_behind(outcome: _PhaseOutcome, protocol: Protocol, *, seed: int) -> None:
    """What the optimized worker leaves behind for the windows after its own, judged as the
    per-kernel audit judges a candidate's (runners.audit.kernel._judge_interrupts, _judge_next_arm):
    - interrupts on the measurement cores per millisecond while the trusted workers were measured,
      beyond the optimized worker's own rate (work left to the kernel: timers, I/O, a sleeping
      thread's timeout firing in another arm's window), lower bound of a bootstrap CI of the mean
      over rounds above `interrupt_excess_per_ms`;
    - the trusted worker measured right after the optimized one against the one that was not
      (runners.audit.rounds.next_arm_slowdown): whatever is left behind, named or not (a cold or
      dirty cache, deferred kernel work), shows as the follower running slower; lower bound above
      1 + `next_arm_tolerance`.
    Freezing stops every thread of a waiting worker, but not what the kernel does on its behalf."""
    rounds = outcome.measured_rounds
    if len(rounds) < _MIN_JUDGED_ROUNDS or not all({"optimized", "baseline", "aa"} <= set(r) for _, r in rounds):
        return
    rates = {label: [r[label].interrupts_per_ms for _, r in rounds] for label in ("optimized", "baseline", "aa")}
    if all(rate is not None for values in rates.values() for rate in values):
        outcome.left_behind["interrupts_per_ms"] = {label: stats.median(values) for label, values in rates.items()}
        est, over = judge_interrupts(rates["optimized"], [rates["baseline"], rates["aa"]], protocol, seed=seed)
        if est is not None:
            outcome.left_behind["interrupts_per_ms_extra_in_trusted"] = [est.point, est.low, est.high]
            if over:
                outcome.fail(Reason("integrity.interrupts_in_other_arms",
                                    f"{outcome.phase}: the measurement cores took {est.point:.2f} more interrupts per ms while "
                                    f"the trusted workers were measured than while the optimized model's worker was "
                                    f"({protocol.interrupt_excess_per_ms:.2f} allowed): work left to the kernel landing in "
                                    "the other arms' windows"))
                return
    names = {"optimized": "candidate", "aa": "baseline_aa", "baseline": "baseline"}
    pairs = [(tuple(names.get(label, label) for label in order), {names[k]: r[k].per_call_s for k in ("baseline", "aa")})
             for order, r in rounds]
    found, over = judge_next_arm(pairs, protocol)
    if found is None:
        return
    outcome.left_behind["next_arm_slowdown"] = list(found)
    if over:
        outcome.fail(Reason("integrity.slows_next_arm",
                            f"{outcome.phase}: the trusted worker measured right after the optimized model's ran "
                            f"{found[0]:.3f}x as long as the one that was not (95% CI [{found[1]:.3f}, {found[2]:.3f}], "
                            f"{1 + protocol.next_arm_tolerance:.2f} allowed): the optimized worker leaves something "
                            "behind that slows the next window"))


# How many of its own billed calls' worth the optimized worker's unbilled first call may take
# beyond the trusted workers' first call (lower bound of a bootstrap CI of the median over rounds),
# the trusted workers' cost beyond their own billed call carried over in seconds. Only models
# whose decode steps over a recurrent state have an unbilled call (runners.modelaudit._decode_bills_from).
# A red team's table of every second token, finished in the first call of the tiny Llama when its
# first call was unbilled too, needed 0.7 more and billed decode at 1.03-1.05x under a limit of 1.
# A next-token table over a recurrent state is a step of vocabulary x batch rows: on the
# development VM 512 rows cost about 26 two-row steps, so 0.5 pays for 2% of the vocabulary (a
# saving of 2% of one call). Where rows are nearly free (a GPU) a table under 0.5 could save up to
# half a call of the sample: the residual.
#
# Why seconds, not ratios: the first step after the prompt pays for caches the prompt left cold,
# about the same time for every arm (the same weights and state). Until 2026-12-06 (thirteenth session) the rule
# compared ratios to each arm's own billed call, which counts that time as more calls the faster a
# model is: the honest compiled Mamba at 2x512 read 2.58 against eager's 1.92 (excess 0.66) and
# was refused, and Dyno's own `torch-compile` reference read 2.54 on the same audit. In seconds
# the same artifact's excess is about 0. What that costs: an artifact that warms its caches at the
# end of the prompt's window (judged with `prompt_slack`) could spend the trusted workers' cold
# time, in the units of its own faster call, on work in the first call: with the ratio rule it
# had 0.5 + C/s_trusted calls for that, with this one 0.5 + C/s_own; on the 2x512 Mamba that is
# about 2 calls against 1.4, far from the 26 a table of the next token costs there.
UNBILLED_CALL_EXCESS = 0.5


def _judge_unbilled_call(outcome: _PhaseOutcome, protocol: Protocol, *, seed: int) -> None:
    """Decode's first call is timed but not billed (its input could be tabulated while preparing).
    The next call's input is its token on the cache that first call leaves, so a table for it
    could only be built inside that first window. Round by round, the optimized worker's first
    window beyond its billed per-call time, less the trusted workers' (their mean, in seconds), in
    units of the optimized worker's billed per-call time: the lower bound of the median's CI may
    not exceed UNBILLED_CALL_EXCESS."""
    mine = outcome.unbilled_s.get("optimized") or []
    trusted = [outcome.unbilled_s.get(label) or [] for label in ("baseline", "aa")]
    if len(mine) < _MIN_JUDGED_ROUNDS or any(len(t) != len(mine) for t in trusted):
        return
    excess = [((window - per_call) - ((a_window - a_call) + (b_window - b_call)) / 2) / per_call
              for (window, per_call), (a_window, a_call), (b_window, b_call) in zip(mine, *trusted)]
    bound = stats.median_ci(excess, seed=suite.derive_seed(seed, "unbilled") & 0xFFFFFFFF,
                            resamples=protocol.bootstrap_resamples, confidence=protocol.confidence)
    outcome.unbilled_excess = [bound.point, bound.low, bound.high]
    if bound.low > UNBILLED_CALL_EXCESS:
        outcome.fail(Reason("integrity.unbilled_call_slow",
                            f"{outcome.phase}: the optimized model's unbilled first call took {bound.point:.1f} of its billed "
                            f"calls' worth more than the trusted workers' first calls (at most {UNBILLED_CALL_EXCESS:g} "
                            "allowed): the next call's input exists only after that call, so work for it done there is hidden work"))


# How far the optimized model's prefill speed taken from its samples' cold first calls may stand
# above the one from its per-call time in the scale `_judge_prompt` uses. Honest: 1.12 for the
# compiled tiny Llama at 2x16 (a cold call costs a fixed amount more, a larger share of a faster
# call), about 1 at larger shapes. Without the cap a vendor could slow only its prefill samples'
# first calls to widen decode's prompt allowance, at a quarter of the price in its prefill figure.
PROMPT_SCALE_CAP = 1.25


def _judge_prompt(outcome: _PhaseOutcome, protocol: Protocol, prefill: dict[str, dict[str, float]] | None, *,
                  seed: int) -> None:
    """Decode's prompt is prefilled in the sample's first window, timed and not billed; a worker
    could do work for its steps there. Round by round, the optimized prompt's window may exceed
    the trusted workers' (their mean) scaled by the optimized model's own prefill speed, as this
    audit's prefill phase measured it, by `prompt_slack` (the lower bound of a bootstrap CI of the
    median ratio) and by more than the idle allowance (`background_cpu_abs_s` +
    `background_cpu_rel` of the expected prompt). The scale is the optimized arm's median first
    call of a prefill sample over the trusted arms' (as cold as the prompt), at most
    PROMPT_SCALE_CAP times the same ratio of per-call medians, and at most 1: a prefill slower
    than eager never widens the allowance (such a model bills nothing: the billed figure is the
    lower phase's). Where prefill was not audited or not accepted, the scale is 1: the prompt may
    take as long as the trusted workers', so a model with a faster prefill has the difference
    (the report says so)."""
    mine = outcome.first_window_s.get("optimized") or []
    trusted = [outcome.first_window_s.get(label) or [] for label in ("baseline", "aa")]
    if len(mine) < _MIN_JUDGED_ROUNDS or any(len(t) != len(mine) for t in trusted):
        return

    def speed(figures: dict[str, float]) -> float | None:
        if all(figures.get(label, 0.0) > 0 for label in ("optimized", "baseline", "aa")):
            return figures["optimized"] / ((figures["baseline"] + figures["aa"]) / 2)
        return None

    cold, warm = speed((prefill or {}).get("first") or {}), speed((prefill or {}).get("all") or {})
    if cold is not None and warm is not None:
        # Never above 1: a red team (seventh session) padded every prefill call to twice its time
        # (prefill accepted at 0.5x, not billable) and spent the doubled allowance on decode's
        # per-step constants (position ids, rotary tables, causal masks for every step) in the
        # prompt's window: decode billable at 1.16-1.17x, 2 of 3 seeds, outputs bit-identical.
        scale = min(cold, PROMPT_SCALE_CAP * warm, 1.0)
        basis = "the optimized model's prefill speed in this audit's prefill phase"
    else:
        scale, basis = 1.0, "the trusted workers' prompts (prefill not audited or not accepted)"
    expected = [scale * (a + b) / 2 for a, b in zip(*trusted)]
    ratio, extra = _ratio_and_excess(mine, expected, protocol, seed=suite.derive_seed(seed, "prompt"))
    allowed = protocol.background_cpu_abs_s + protocol.background_cpu_rel * stats.median(expected)
    outcome.prompt = {"ratio": [ratio.point, ratio.low, ratio.high], "scale": scale, "scale_first_calls": cold,
                      "scale_per_call": warm, "basis": basis, "extra_s": extra, "extra_allowed_s": allowed,
                      "slack": protocol.prompt_slack,
                      "median_s": {label: stats.median(v) for label, v in outcome.first_window_s.items() if v}}
    if ratio.low > 1.0 + protocol.prompt_slack and extra > allowed:
        outcome.fail(Reason("integrity.unbilled_call_slow",
                            f"{outcome.phase}: the optimized model's prompt prefill (timed, not billed) took {ratio.point:.2f}x "
                            f"what its prefill speed predicts from the trusted workers' ({extra * 1e3:.2f} ms more a round; "
                            f"at most {protocol.prompt_slack:.0%} allowed): work for the steps done there is hidden work"))


def _fetch(worker: Worker, call: int, positions: list[int], timeout: float) -> torch.Tensor | None:
    reply = worker.call("fetch", timeout=timeout, call=call, positions=positions)
    return reply.tensors[0] if len(reply.tensors) == 1 else None


def _described(meta: Any) -> list[dict[str, Any]] | None:
    """A worker's description of one call's outputs, if it is one (a list of dicts)."""
    return meta if isinstance(meta, list) and all(isinstance(item, dict) for item in meta) else None


def _check_round(outcome: _PhaseOutcome, slots: dict[str, _Slot], records: dict[str, ModelSample], protocol: Protocol, *,
                 round_index: int, rng: np.random.Generator, calls: int, batch: int, commit_seed: int,
                 device: str, timeout: float, compare_aa: bool) -> None:
    """Judge the optimized worker's timed calls of one round against the baseline's, on outputs fetched
    after the window closed: the timer, the cores, the outputs' kind, values and commitments."""
    where = f"{outcome.phase} round {round_index + 1}"
    record = records["optimized"]
    if record.clock_problem:
        outcome.fail(Reason("timing.clock_mismatch", f"{where}: {record.clock_problem}"))
    widened = slots["optimized"].worker.cpus_widened()
    if widened:
        outcome.fail(Reason("integrity.cpus_widened", f"{where}: the optimized model's threads may run on core(s) {widened}"))
    base_metas = [_described(meta) for meta in records["baseline"].metas]
    if len(base_metas) != calls or not all(meta and meta[0].get("exact_tensor") for meta in base_metas):
        raise ModelAuditError(f"{where}: the baseline model returned no tensor output ({records['baseline'].metas[:1]})")
    # Each call's rows as the trusted baseline answered them: the sequence for a decoder's prefill,
    # the new tokens of a decode step (two in decode's first call over a key/value cache, one after).
    shapes = [tuple(meta[0]["shape"]) for meta in base_metas]
    dtype = str(base_metas[0][0]["dtype"])
    mine = [_described(meta) for meta in record.metas] + [None] * (calls - len(record.metas))
    device_type = torch.device(device).type
    problems = checks.check_output_meta(mine[0], expected_shapes=[shapes[0]], dtype=dtype, device_type=device_type, where=where)
    off = [call for call in range(1, calls)
           if checks.check_output_meta(mine[call], expected_shapes=[shapes[call]], dtype=dtype, device_type=device_type, where=where)]
    if off:
        problems.append(Reason("correctness.timed_output_mismatch", f"{where}: calls {off[:5]} returned a different kind of output than the baseline's"))
    for reason in problems:
        outcome.fail(reason)
    if problems:
        return
    atol, rtol = FORWARD_TOLERANCE.get(dtype, FORWARD_TOLERANCE["float32"])
    outcome.tolerance = (atol, rtol)
    width = shapes[0][-1]
    elsize = torch.empty((), dtype=getattr(torch, dtype, torch.float32)).element_size()
    weights = commit_weights(commit_seed, width)
    claimed_all = record.checksums
    for call in sorted(int(c) for c in rng.choice(calls, size=min(protocol.verify_per_round, calls), replace=False)):
        shape = shapes[call]
        length = shape[-2] if len(shape) >= 2 else 1
        rows = max(1, min(length, FETCH_BYTES // max(1, batch * width * elsize)))
        positions = sorted(int(p) for p in rng.choice(length, size=rows, replace=False))
        reference = _fetch(slots["baseline"].worker, call, positions, timeout)
        output = _fetch(slots["optimized"].worker, call, positions, timeout)
        expected = (*shape[:-2], len(positions), width)
        if reference is None or tuple(reference.shape) != expected:
            raise ModelAuditError(f"{where}: the baseline worker sent no usable outputs for call {call}")
        if output is None or tuple(output.shape) != expected:
            outcome.fail(Reason("correctness.shape", f"{where}, call {call}: the optimized worker sent outputs of shape "
                                                     f"{None if output is None else list(output.shape)}, expected {list(expected)}"))
            return
        comparison = checks.compare_tensors(output, reference, atol=atol, rtol=rtol)
        outcome.checked += 1
        outcome.max_abs_err = max(outcome.max_abs_err, comparison.max_abs_err)
        outcome.worst_ratio = max(outcome.worst_ratio, comparison.worst_ratio)
        if comparison.nonfinite:
            outcome.fail(Reason("correctness.nonfinite", f"{where}, call {call}: the optimized model's logits hold NaN or Inf where the baseline's are finite"))
        elif not comparison.passed:
            outcome.fail(Reason("correctness.mismatch",
                                f"{where}, call {call}: the optimized model's outputs differ from the baseline's by up to "
                                f"{comparison.max_abs_err:.3g} ({comparison.worst_ratio:.3g}x the tolerance atol={atol:g} x row rms "
                                f"+ rtol={rtol:g} x |ref|, {comparison.failed_fraction:.1%} of values outside)"))
        claimed = claimed_all[call] if call < len(claimed_all) else []
        flat = output.reshape(-1, width)
        indices = [b * length + p for b in range(flat.shape[0] // len(positions)) for p in positions]
        if len(claimed) != flat.shape[0] // len(positions) * length or not all(
                measure.commitment_holds(float(claimed[i]), row.abs(), weights) for i, row in zip(indices, flat)):
            outcome.fail(Reason("integrity.commitment_mismatch", f"{where}, call {call}: outputs differ from the checksums committed when the window closed"))
        # The A/A worker is fetched from exactly as the baseline is, every round: a fetch allocates
        # and copies in the worker between its samples, and an arm spared it measured 1-3% faster
        # in decode (benchmarks/model_aa.py, 2026-12-05), a difference of treatment the A/A widening
        # then charged to every figure. The reference is only as good as the baseline's
        # determinism: two identical trusted workers must agree (bit for bit on CPU).
        again = _fetch(slots["aa"].worker, call, positions, timeout)
        if compare_aa and (again is None or not checks.compare_tensors(again, reference, atol=atol, rtol=rtol).passed):
            raise ModelAuditError(f"{where}: two baseline workers disagree on the same tokens; the model is not deterministic enough to audit")
        for label in records:
            if label.startswith("ref:"):  # reference points too: the same treatment as the arms they are set beside
                with contextlib.suppress(SandboxError):
                    _fetch(slots[label].worker, call, positions, timeout)


def _estimate(numerators: list[float], denominators: list[float], protocol: Protocol, seed: int) -> stats.Estimate | None:
    if not numerators or len(numerators) != len(denominators):
        return None
    return stats.paired_ratio_ci(numerators, denominators, resamples=protocol.bootstrap_resamples,
                                 confidence=protocol.confidence, seed=seed & 0xFFFFFFFF)


def _entry(outcome: _PhaseOutcome, protocol: Protocol, *, batch: int, seq: int, seed: int) -> dict[str, Any]:
    """One phase's result. Like the per-kernel entries: the paired CI over rounds is widened by the
    A/A control's deviation (what differs between two identical processes, which no bootstrap over
    rounds can see), and only an accepted phase has a speedup."""
    fin = result.finite_or_none
    base = outcome.slots.get("baseline", [])
    optimized = outcome.slots.get("optimized", [])
    aa_samples = outcome.slots.get("aa", [])
    rounds_ci = _estimate(base, optimized, protocol, suite.derive_seed(seed, outcome.phase, "bootstrap"))
    aa = _estimate(base, aa_samples, protocol, suite.derive_seed(seed, outcome.phase, "bootstrap-aa"))
    factor = max(1.0, aa.high, 1.0 / aa.low) if aa else 1.0
    speed = stats.Estimate(rounds_ci.point, rounds_ci.low / factor, rounds_ci.high * factor) if rounds_ci else None
    accepted = outcome.verdict == "accepted" and speed is not None
    if outcome.verdict == "accepted" and speed is None:
        outcome.fail(Reason("harness.error", "no measured rounds"), verdict="error")
    stable = aa.within(protocol.aa_tolerance) if aa else None
    atol, rtol = outcome.tolerance or (None, None)
    references = {}
    for label, samples in outcome.slots.items():
        if label.startswith("ref:") and accepted and len(samples) == len(base):
            # Two processes on either side, as for the billed figure: the same A/A widening.
            over_eager = _estimate(base, samples, protocol, suite.derive_seed(seed, outcome.phase, label))
            artifact_over = _estimate(samples, optimized, protocol, suite.derive_seed(seed, outcome.phase, label, "artifact"))
            references[label[4:]] = {
                "median_s": fin(stats.median(samples)),
                "speedup_over_eager": fin(over_eager.point) if over_eager else None,
                "ci95": [over_eager.low / factor, over_eager.high * factor] if over_eager else None,
                "artifact_over_reference": fin(artifact_over.point) if artifact_over else None,
                "artifact_over_reference_ci95": [artifact_over.low / factor, artifact_over.high * factor] if artifact_over else None,
            }
    return {
        "phase": outcome.phase,
        "verdict": outcome.verdict,
        "reasons": [r.to_dict() for r in outcome.reasons],
        "speedup": fin(speed.point) if accepted and speed else None,
        "ci95": [speed.low, speed.high] if accepted and speed else None,
        "ci95_rounds": [rounds_ci.low, rounds_ci.high] if accepted and rounds_ci else None,
        "aa": {"speedup": fin(aa.point) if aa else None, "ci95": [aa.low, aa.high] if aa else None, "stable": stable},
        "baseline_median_s": fin(stats.median(base)) if base else None,
        "optimized_median_s": fin(stats.median(optimized)) if optimized else None,
        "rounds": len(optimized),
        "calls_per_sample": outcome.calls,
        "billable": bool(accepted and stable and speed is not None and speed.low > 1.0),
        "inputs": {"batch": batch, "seq": seq} if outcome.phase == "prefill"
        else {"batch": batch, "cache_tokens": seq, "new_tokens": 1, "first_call_new_tokens": outcome.first_tokens},
        "correctness": {
            "passed": outcome.verdict != "error" and not any(r.code.startswith("correctness.") for r in outcome.reasons),
            "checked_calls": outcome.checked, "max_abs_err": fin(outcome.max_abs_err),
            "worst_ratio": fin(outcome.worst_ratio), "atol": atol, "rtol": rtol,
        },
        "samples_s": {"baseline": base, "optimized": optimized, "aa": aa_samples,
                      **{label: v for label, v in outcome.slots.items() if label.startswith("ref:")}},
        # Free to have, measured in the same rounds; never billed (paired CIs over rounds, widened by the A/A deviation).
        "reference_points": references,
        "notes": outcome.notes,
        "cpu_while_others_measured_s": {label: fin(sum(v) / len(v)) for label, v in outcome.meanwhile.items() if v},  # mean per round
        "frozen_between_samples": outcome.frozen_between_samples,
        # Whether the parent held each worker's measurement core for its whole sample (sample.CoreFence:
        # nothing of the worker ran between a reply and the next request; no run-queue discount): the
        # share of measured samples, every arm's, where it did.
        "held_between_calls": (sum(outcome.held_samples) / len(outcome.held_samples)) if outcome.held_samples else None,
        # Frozen samples: each arm's CPU from its last reply to the freeze, median per round (judged
        # with its idle CPU in background_cpu).
        "cpu_after_last_reply_s": {label: fin(stats.median(v)) for label, v in outcome.after_reply_s.items() if v},
        "billed_from_call": outcome.bill_from,  # decode: counted in steps, after the prompt
        # Decode: the prompt's prefill, the sample's first window, timed, judged and not billed.
        "prompt": outcome.prompt if outcome.phase == "decode" else None,
        "unbilled_call_per_billed_call": {label: fin(stats.median([window / per_call for window, per_call in v]))
                                          for label, v in outcome.unbilled_s.items() if v},
        # The optimized model's first call beyond the trusted workers' (seconds, in its billed calls):
        # [point, low, high], judged against unbilled_call_excess_allowed
        "unbilled_call_excess": [fin(v) for v in outcome.unbilled_excess] if outcome.unbilled_excess else None,
        "unbilled_call_excess_allowed": UNBILLED_CALL_EXCESS if outcome.unbilled_excess else None,
        # What the optimized worker left behind for later windows (_judge_left_behind): interrupt
        # rates per arm and the trusted arms' excess; the next arm's slowdown [point, low, high].
        "left_behind": outcome.left_behind,
        # CPU outside the optimized worker's windows beyond the trusted workers' (_judge_background):
        # while others were measured (mean per round), while idle ([point, low, high] of the median
        # per round) and while preparing (ratio and median excess), each with what is allowed.
        "background_cpu": outcome.background,
    }
