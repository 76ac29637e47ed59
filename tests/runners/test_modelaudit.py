"""The whole-model audit on tiny real models: baseline vs optimized forward in sandboxed workers."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest

from optimizer.model import Strategy, optimize_model
from runners import checks
from runners import measure
from runners.modelaudit import FORWARD_TOLERANCE, PHASE_BUDGET_S, _phase_rounds, audit_model_forward
from runners.samples import write_sample_model

BATCH, SEQ, ROUNDS = 2, 16, 4
CAN_HOLD = len(os.sched_getaffinity(0)) == 2 and os.geteuid() == 0

# A wrong "optimized" model: the final norm's weight scaled by 1.5 scales every logit by 1.5.
SCALED_NORM = """
import torch

def transform(model):
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    return model
"""


def _audit(model_dir, artifact=None, **kwargs):
    options = dict(batch=BATCH, seq=SEQ, device="cpu", profile="cpu-ci", seed=7, rounds=ROUNDS)
    options.update(kwargs)
    return audit_model_forward(model_dir, artifact, **options)


def _ids(*values: int):
    """A `step` request's tensor: [call set, token ids...] as int64 (runners.audit.model_sample)."""
    import torch

    return torch.tensor(values, dtype=torch.int64)


def _phase(report: dict, name: str) -> dict:
    return next(p for p in report["phases"] if p["phase"] == name)


@pytest.fixture(scope="module")
def llama_artifact(sample_models):
    # The optimizer's real artifact, with the quick timer fixed so that no strategy beats the
    # unmodified model: `baseline`, applied through optimizer.model.apply without compiling.
    artifact = optimize_model(sample_models["llama"], batch=BATCH, seq=SEQ, device="cpu", try_compile=False,
                              timer=lambda fn, prepare=None: 1.0)
    assert artifact.strategy == Strategy.BASELINE
    return artifact


@pytest.fixture(scope="module")
def llama_report(sample_models, llama_artifact):
    progress: list[tuple[float, str]] = []
    report = _audit(sample_models["llama"], llama_artifact, progress=lambda f, m: progress.append((f, m)))
    report["_progress"] = progress
    return report


def test_it_audits_prefill_and_decode_of_a_llama_with_an_aa_control(llama_report):
    assert [p["phase"] for p in llama_report["phases"]] == ["prefill", "decode"]
    assert llama_report["artifact_strategy"] == "baseline" and llama_report["model_class"] == "LlamaForCausalLM"
    for phase in llama_report["phases"]:
        assert phase["verdict"] == "accepted", phase["reasons"]
        assert phase["rounds"] == ROUNDS and phase["calls_per_sample"] >= 1
        low, high = phase["ci95"]
        assert math.isfinite(low) and low <= phase["speedup"] <= high
        assert 0.3 < phase["speedup"] < 3.0  # the same model on both sides
        assert phase["baseline_median_s"] > 0 and phase["optimized_median_s"] > 0
        aa = phase["aa"]
        assert aa["ci95"][0] <= aa["speedup"] <= aa["ci95"][1] and isinstance(aa["stable"], bool)
        assert phase["billable"] == (aa["stable"] and low > 1.0)
        # The parent held each worker's only measurement core through each whole sample, where it may
        # (two cores, one of them the workers', and SCHED_FIFO as root: CI's machine).
        assert phase["held_between_calls"] == (1.0 if CAN_HOLD else 0.0)
        assert all(len(samples) == ROUNDS for samples in phase["samples_s"].values())
        # A waiting worker uses no CPU while another is measured.
        assert all(v < 0.0005 for v in phase["cpu_while_others_measured_s"].values()), phase["cpu_while_others_measured_s"]
        # Interrupts on the measurement cores are counted in every arm's windows (the rate the
        # kernel's tick alone gives is well above zero); the same model leaves nothing behind.
        rates = phase["left_behind"]["interrupts_per_ms"]
        assert set(rates) == {"optimized", "baseline", "aa"} and all(r > 0 for r in rates.values()), rates
        assert phase["left_behind"]["interrupts_per_ms_extra_in_trusted"][1] <= measure.protocol_for("cpu-ci").interrupt_excess_per_ms
        # Identical models on identical tokens: the logits agree bit for bit.
        assert phase["correctness"]["passed"] and phase["correctness"]["max_abs_err"] == 0.0
        assert phase["correctness"]["checked_calls"] >= ROUNDS
        assert (phase["correctness"]["atol"], phase["correctness"]["rtol"]) == FORWARD_TOLERANCE["float32"]
    decode = _phase(llama_report, "decode")
    # Over a key/value cache decode's first call carries two new tokens and every call is billed.
    assert decode["inputs"] == {"batch": BATCH, "cache_tokens": SEQ, "new_tokens": 1, "first_call_new_tokens": 2}
    assert decode["billed_from_call"] == 0 and decode["unbilled_call_per_billed_call"] == {}
    assert llama_report["protocol"]["threads"] == 1 and llama_report["protocol"]["discount_preemption"]


def test_it_reports_progress_from_loading_to_the_verdicts(llama_report):
    fractions = [f for f, _ in llama_report["_progress"]]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert "prefill accepted" in llama_report["_progress"][-1][1]


def test_it_rejects_an_optimized_model_whose_logits_are_wrong(sample_models, llama_artifact):
    report = _audit(sample_models["llama"], llama_artifact, transform_source=SCALED_NORM)
    for phase in report["phases"]:
        assert phase["verdict"] == "rejected"
        codes = [r["code"] for r in phase["reasons"]]
        assert codes == ["correctness.mismatch"] and all(c in checks.REASON_CODES for c in codes)
        assert phase["speedup"] is None and phase["ci95"] is None and not phase["billable"]
        assert phase["rounds"] == 0  # caught in the warm-up round: a wrong model is not timed further
        assert phase["correctness"]["worst_ratio"] > 1.0


def test_it_rejects_an_optimized_side_that_works_between_its_windows(sample_models):
    # Right logits, but a thread that keeps computing while the worker should be idle (where
    # precomputed outputs or a stolen core would come from).
    busy = "import threading\n\ndef transform(model):\n" \
           "    threading.Thread(target=lambda: [sum(range(10_000)) for _ in iter(int, 1)], daemon=True).start()\n" \
           "    return model\n"
    report = _audit(sample_models["llama"], None, transform_source=busy, phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "rejected" and [r["code"] for r in prefill["reasons"]] == ["integrity.background_cpu"]
    assert prefill["correctness"]["passed"] and not prefill["billable"]


# Work done for a sample's calls before they are requested, where nothing bills: in `prepare`
# (before the sample) or in `release` (after the round's checks, the worker counted idle). A red
# team built the tiny Llama's per-forward constants there (cache object, causal mask, rotary
# tables: about 80 us of a ~700 us forward, 0.5-0.9 ms a round) and billed an unmodified model at
# 1.10-1.17x under the 1 ms + 10% allowance of the time (2026-12-05, sixth session). The stand-in
# here spends 0.6 ms a round of CPU in the same places.
HOISTED = """
import time
import runners.audit.model_worker as mw

_original = mw.ModelRunner.{op}

def _burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def {op}(self, header, tensors):
    answer = _original(self, header, tensors)
    _burn(0.0006)
    return answer

mw.ModelRunner.{op} = {op}

def transform(model):
    return model
"""


@pytest.mark.parametrize("op", ["op_prepare", "op_release"])
def test_work_hoisted_before_the_calls_that_use_it_is_rejected(sample_models, op):
    prefill = _phase(_audit(sample_models["llama"], None, transform_source=HOISTED.format(op=op), phases=("prefill",),
                            rounds=8), "prefill")
    assert prefill["verdict"] == "rejected", (prefill["verdict"], prefill.get("background"))
    assert [r["code"] for r in prefill["reasons"]] == ["integrity.background_cpu"]
    if op == "op_release":  # judged as idle, and shown apart as the release's share
        background = prefill["background_cpu"]
        assert background["release_s"] > 0.0004 and background["idle_s"][1] > background["idle_allowed_s"], background


# Adversaries against the stepped protocol (runners.audit.model_sample), one per way a paid party
# would move the figure: they patch the worker's own code, as an artifact's applier can.

# Claims each call took a microsecond: the worker's clock is not the one that bills.
CLAIMS_NO_TIME = """
import runners.audit.model_worker as mw
_step = mw.ModelRunner.op_step

def op_step(self, header, tensors):
    reply, out = _step(self, header, tensors)
    reply["t0"] = reply["t1"] - 1000
    return reply, out

mw.ModelRunner.op_step = op_step

def transform(model):
    return model
"""

# Answers each call at once with made-up commitments and computes the outputs only when the parent
# fetches them (deferring work past the window, or holding calls back to batch them with later ones).
ANSWERS_FIRST = """
import time
import torch
import runners.audit.model_worker as mw
from runners import checks

_step = mw.ModelRunner.op_step

def op_step(self, header, tensors):
    if self.phase == "decode" and int(header["call"]) == 0:  # decode's prompt, as it comes
        self.later = [None]
        return _step(self, header, tensors)
    if int(header["call"]) == 0:
        self.outputs, self.later = [], []
    self.later.append(self._call_inputs(tensors[0])[0])
    ids = self.later[-1]["input_ids"]
    shape = (*ids.shape, self.model.config.vocab_size)
    self.outputs.append(None)
    _, meta = checks.inspect_outputs(torch.empty(shape), [], expect_tuple=False)
    now = time.perf_counter_ns()
    return {"t0": now, "t1": now + 1, "meta": meta}, [torch.zeros(shape[0] * shape[1])]

def op_fetch(self, header, tensors):
    call = int(header["call"])
    if self.outputs[call] is None:
        with torch.no_grad():
            self.outputs[call] = mw._logits(self.model(**self.later[call]))
    return _fetch(self, header, tensors)

_fetch = mw.ModelRunner.op_fetch
mw.ModelRunner.op_step, mw.ModelRunner.op_fetch = op_step, op_fetch

def transform(model):
    return model
"""

# Skips the output head: a linear commitment sum(row * w) of logits equals hidden @ (head^T w), so it
# commits without the head's GEMM and computes logits only for the rows the parent fetches.
HEAD_SHORTCUT = """
import time
import torch
import runners.audit.model_worker as mw
from runners import checks
from runners.audit.model_inputs import commit_weights

def op_step(self, header, tensors):
    if int(header["call"]) == 0:
        self.outputs = []
    kwargs, _ = self._call_inputs(tensors[0])
    t0 = time.perf_counter_ns()
    with torch.no_grad():
        hidden = self.model.model(**kwargs).last_hidden_state
        head = self.model.lm_head.weight
        weights = commit_weights(self.commit_seed, head.shape[0])
        sums = hidden.reshape(-1, hidden.shape[-1]) @ (head.t() @ weights)
    self.outputs.append(hidden)
    _, meta = checks.inspect_outputs(torch.empty(*hidden.shape[:-1], head.shape[0]), [], expect_tuple=False)
    return {"t0": t0, "t1": time.perf_counter_ns(), "meta": meta}, [sums]

def op_fetch(self, header, tensors):
    hidden = self.outputs[int(header["call"])]
    rows = hidden.index_select(-2, torch.tensor([int(p) for p in header["positions"]]))
    with torch.no_grad():
        return {}, [(rows @ self.model.lm_head.weight.t()).contiguous()]

mw.ModelRunner.op_step, mw.ModelRunner.op_fetch = op_step, op_fetch

def transform(model):
    return model
"""


# Builds, in decode's prompt window (the only place the prompt is known), a table of every next
# token's logits for each batch entry (a small vocabulary makes it cheap enough), and answers the
# first step from it. Before 2026-12-05 (seventh session) the prompt was known in `prepare` (5.3x accepted before
# that was judged). The first step carries two tokens per entry over a key/value cache, whose
# outputs no one-token table holds, and the table's cost lands in the prompt's judged window.
DECODE_TABLE = """
import time
import torch
import runners.audit.model_worker as mw
from runners import checks
from runners.audit.model_inputs import commit_weights, row_commitments

_step = mw.ModelRunner.op_step

def op_step(self, header, tensors):
    call = int(header["call"])
    if self.phase != "decode" or call > 1:
        return _step(self, header, tensors)
    if call == 0:
        reply = _step(self, header, tensors)
        prompts = tensors[0][1:].view(self.batch, self.seq)
        vocab = self.model.config.vocab_size
        with torch.no_grad():  # every one-token continuation of each batch entry's prompt
            self.table = [mw._logits(self.model(input_ids=torch.cat([prompt.expand(vocab, -1), torch.arange(vocab).view(-1, 1)], 1)))[:, -1, :]
                          for prompt in prompts]
        return reply
    item = tensors[0].tolist()
    t0 = time.perf_counter_ns()
    # The first step answered from the table: the first new token of each batch entry.
    per_entry = (len(item) - 1) // self.batch
    out = torch.stack([self.table[b][item[1 + b * per_entry]] for b in range(self.batch)]).unsqueeze(1)
    if self.weights is None:
        self.weights = commit_weights(self.commit_seed, out.shape[-1])
    sums = row_commitments(out, self.weights)
    _, meta = checks.inspect_outputs(out, [], expect_tuple=False)
    self.outputs.append(out)
    return {"t0": t0, "t1": time.perf_counter_ns(), "meta": meta}, [sums]

mw.ModelRunner.op_step = op_step

def transform(model):
    return model
"""


# Works while the others are measured: from the worker's last call of a round until its next call, a
# thread streams through memory in short bursts (0.25 ms every 2 ms), under the parent's settling
# threshold (0.3 ms over 2 ms), so the next worker's window opens while it runs (on the same cores:
# it steals time and leaves cold caches). Within the idle allowance then (5 ms + 10% a round), so it was
# accepted before CPU during the others' windows was judged. An earlier form (one 3 ms burst 4 ms
# after the last call) was sometimes waited out by the settling (0.0 ms in the others' windows,
# measured) and rightly accepted: work the parent waits out is in nobody's window.
INTERFERES = """
import threading
import time
import runners.audit.model_worker as mw

_step, _prepare = mw.ModelRunner.op_step, mw.ModelRunner.op_prepare
_idle = threading.Event()

def _burn():
    scratch = bytearray(8 << 20)
    page = 0
    while True:
        _idle.wait()
        end = time.perf_counter() + 0.00025
        while time.perf_counter() < end:
            for _ in range(64):
                scratch[page] = (scratch[page] + 1) & 255
                page = (page + 4096) % len(scratch)
        time.sleep(0.00175)

threading.Thread(target=_burn, daemon=True).start()

def op_prepare(self, header, tensors):
    self.last_call = int(header["calls"]) - 1
    return _prepare(self, header, tensors)

def op_step(self, header, tensors):
    _idle.clear()
    reply = _step(self, header, tensors)
    if int(header["call"]) == self.last_call:
        _idle.set()
    return reply

mw.ModelRunner.op_step, mw.ModelRunner.op_prepare = op_step, op_prepare

def transform(model):
    return model
"""


# The run-queue discount against a stale floor (a red team, 2026-12-05): every forward runs in a
# helper thread while the main thread, whose run-queue wait the parent takes off, yields (it cannot
# make itself SCHED_IDLE any more; it still waits runnable behind the helper), so the forward is
# booked as waiting. The floor under the discount is the tree's CPU; on a sample's last call the
# helper sends the reply itself and runs on for 1.5 ms, so that CPU read at the reply misses up to
# a scheduler tick of it. Billed the unmodified model at 1.39-1.41x with seccomp refusing the
# scheduling change, before the parent read the CPU from the frozen worker.
TICK_LAG = """
import ctypes
import os
import sys
import threading
import time
import runners.audit.model_worker as mw
import runners.sandbox.zygote as zygote
from runners.sandbox.wire import send_message

libc = ctypes.CDLL(None, use_errno=True)
state = {"sock": None, "job": None, "result": None, "done": False, "swallow": False}
frame = sys._getframe()
while frame is not None and state["sock"] is None:
    if frame.f_code.co_name == "serve":
        state["sock"] = frame.f_locals.get("sock")
    frame = frame.f_back
wake_r, wake_w = os.pipe()
_step = mw.ModelRunner.op_step

def _helper():
    while True:
        os.read(wake_r, 1)
        runner, header, tensors, last = state["job"]
        result = _step(runner, header, tensors)
        if last and state["sock"] is not None:
            send_message(state["sock"], {"ok": True, **result[0]}, result[1])
            state["swallow"] = True
            end = time.perf_counter() + 0.0015
            while time.perf_counter() < end:
                pass
        state["result"], state["done"] = result, True

threading.Thread(target=_helper, daemon=True).start()
sys.setswitchinterval(0.5)
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except OSError:
    pass

def op_step(self, header, tensors):
    state["job"], state["done"] = (self, header, tensors, int(header["call"]) == self.calls - 1), False
    os.write(wake_w, b"x")
    while not state["done"]:
        libc.sched_yield()
    self.next_request_soon = int(header["call"]) < self.calls - 1
    return state["result"]

_send = zygote.send_message

def swallowing_send(sock, header, tensors=()):
    if state["swallow"]:
        state["swallow"] = False
        return None
    return _send(sock, header, tensors)

mw.ModelRunner.op_step, zygote.send_message = op_step, swallowing_send

def transform(model):
    return model
"""


def test_a_forward_booked_as_waiting_behind_a_stale_cpu_reading_is_not_taken_off(sample_models):
    prefill = _phase(_audit(sample_models["llama"], None, transform_source=TICK_LAG, phases=("prefill",), rounds=15),
                     "prefill")
    assert prefill["frozen_between_samples"] is True
    assert not prefill["billable"]
    if prefill["verdict"] == "accepted":
        assert prefill["ci95"][0] < 1.03 and prefill["speedup"] < 1.08, prefill["ci95"]


def test_the_worker_clock_does_not_bill_a_call_it_claims_took_no_time(sample_models):
    # Billed on the worker's own timestamps, this was accepted at 3x (two thirds of each sample
    # claimed away) and 9,000x (the work moved into the commitment request).
    prefill = _phase(_audit(sample_models["llama"], None, transform_source=CLAIMS_NO_TIME, phases=("prefill",)), "prefill")
    assert prefill["verdict"] == "accepted", prefill["reasons"]
    assert 0.5 < prefill["speedup"] < 2.0


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_worker_that_answers_before_computing_is_caught_by_its_commitments(sample_models, phase):
    report = _audit(sample_models["llama"], None, transform_source=ANSWERS_FIRST, phases=(phase,))
    result = _phase(report, phase)
    assert result["verdict"] == "rejected" and not result["billable"]
    codes = [r["code"] for r in result["reasons"]]
    if phase == "prefill":
        assert codes == ["integrity.commitment_mismatch"]
        assert result["correctness"]["passed"]  # the fetched logits themselves are right
    else:
        # Decode steps extend one cache in turn: logits computed later, over the cache as the
        # sample left it, are wrong as well as uncommitted.
        assert "integrity.commitment_mismatch" in codes


def test_a_commitment_cannot_be_made_through_the_output_heads_linearity(sample_models):
    report = _audit(sample_models["llama"], None, transform_source=HEAD_SHORTCUT, phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "rejected" and not prefill["billable"]
    assert [r["code"] for r in prefill["reasons"]] == ["integrity.commitment_mismatch"]


# Works inside decode's first call, where a table for the next call's token could be built (that
# token extends the cache the first call leaves): 20 ms of spinning before the honest step.
SLOW_FIRST_STEP = """
import time
import runners.audit.model_worker as mw

_step = mw.ModelRunner.op_step

def op_step(self, header, tensors):
    if int(header["call"]) == 1 and self.phase == "decode":  # the first step, after the prompt (call 0)
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            pass
    return _step(self, header, tensors)

mw.ModelRunner.op_step = op_step

def transform(model):
    return model
"""


def test_work_in_decodes_first_call_is_billed_over_a_key_value_cache(sample_models):
    decode = _phase(_audit(sample_models["llama"], None, transform_source=SLOW_FIRST_STEP, phases=("decode",)), "decode")
    assert decode["billed_from_call"] == 0 and decode["inputs"]["first_call_new_tokens"] == 2
    assert decode["verdict"] == "accepted", decode["reasons"]
    assert decode["speedup"] < 0.9 and not decode["billable"]


def test_work_in_a_recurrent_models_unbilled_first_call_is_judged(tmp_path):
    # A state-space model's cache steps one token at a time: its first call's input (one token on
    # the prompt's state) could be tabulated while preparing, so it is timed and judged, not billed.
    folder = write_sample_model(tmp_path / "mamba", "mamba")
    decode = _phase(_audit(folder, None, transform_source=SLOW_FIRST_STEP, phases=("decode",)), "decode")
    assert decode["billed_from_call"] == 1 and decode["inputs"]["first_call_new_tokens"] == 1
    assert decode["verdict"] == "rejected" and not decode["billable"]
    assert [r["code"] for r in decode["reasons"]] == ["integrity.unbilled_call_slow"]
    ratios = decode["unbilled_call_per_billed_call"]
    assert ratios["optimized"] > ratios["baseline"] + 1.0, ratios
    excess = decode["unbilled_call_excess"]  # 20 ms beyond the trusted workers' first call, in billed calls
    assert excess[1] > decode["unbilled_call_excess_allowed"] and excess[0] > ratios["optimized"] - ratios["baseline"] - 1, excess


def test_a_next_token_table_built_in_the_prompts_window_cannot_answer_decodes_first_step(sample_models):
    # Every one-token continuation of the prompt, tabulated where the prompt is revealed: the first
    # step reveals two tokens per batch entry, whose outputs no such table holds, and the table's
    # cost makes the prompt's window far longer than the optimized model's prefill predicts.
    decode = _phase(_audit(sample_models["llama"], None, transform_source=DECODE_TABLE), "decode")
    assert decode["verdict"] == "rejected" and not decode["billable"]
    assert {r["code"] for r in decode["reasons"]} <= {"correctness.timed_output_mismatch", "integrity.unbilled_call_slow"}, decode["reasons"]
    assert decode["billed_from_call"] == 0


# Work for decode's steps done in its prompt's window (timed, not billed): 60% of the prompt's time.
IN_THE_PROMPT = """
import time
import runners.audit.model_worker as mw

_step = mw.ModelRunner.op_step

def op_step(self, header, tensors):
    started = time.thread_time()
    reply = _step(self, header, tensors)
    if self.phase == "decode" and int(header["call"]) == 0:
        end = time.thread_time() + 0.6 * (time.thread_time() - started)
        while time.thread_time() < end:
            pass
    return reply

mw.ModelRunner.op_step = op_step

def transform(model):
    return model
"""


def test_work_in_decodes_prompt_window_is_judged_against_the_models_own_prefill(sample_models):
    # 12 rounds: at 6 the prompt ratio's lower bound once fell inside the slack on CI (2026-12-06).
    report = _audit(sample_models["llama"], None, transform_source=IN_THE_PROMPT, rounds=12)
    prefill, decode = _phase(report, "prefill"), _phase(report, "decode")
    assert prefill["verdict"] == "accepted" and prefill["prompt"] is None
    assert decode["verdict"] == "rejected" and [r["code"] for r in decode["reasons"]] == ["integrity.unbilled_call_slow"]
    prompt = decode["prompt"]
    assert prompt["ratio"][1] > 1 + prompt["slack"] and prompt["extra_s"] > prompt["extra_allowed_s"], prompt
    assert "prefill phase" in prompt["basis"] and 0.7 < prompt["scale"] < 1.4  # the same model: about 1


def _prompt_outcome(optimized_ms: float) -> "modelaudit._PhaseOutcome":
    from runners import modelaudit

    outcome = modelaudit._PhaseOutcome("decode")
    rounds = 12
    outcome.first_window_s = {"baseline": [1e-3 * (1 + 0.01 * (r % 3)) for r in range(rounds)],
                        "aa": [1e-3 * (1 - 0.01 * (r % 2)) for r in range(rounds)],
                        "optimized": [optimized_ms * 1e-3 * (1 + 0.01 * (r % 4)) for r in range(rounds)]}
    return outcome


@pytest.mark.parametrize("optimized_ms, prefill_first_ms, rejected", [
    (0.62, 0.6, False),  # a prompt as fast as the model's prefill (0.6 of the trusted's)
    (0.85, 0.6, True),   # the same model with 0.25 ms of other work a round in its prompt
    (0.85, None, False),  # without a prefill phase the trusted prompts are the bound: said in the report
    (1.30, None, True),
    # Only the prefill samples' first calls slowed (to 0.9 of the trusted's, where its per-call time
    # says 0.6): 0.35 ms of other work in the prompt would read 1.06 against them; the scale is
    # capped at PROMPT_SCALE_CAP x 0.6, against which it reads 1.27.
    (0.95, 0.9, True),
    # A prefill made twice as slow (a red team, seventh session) does not double the prompt's
    # allowance: the scale stops at 1.
    (1.6, 2.0, True),
])
def test_the_prompt_judge_scales_the_trusted_prompts_by_the_models_own_prefill_speed(optimized_ms, prefill_first_ms, rejected):
    from runners import modelaudit

    protocol = measure.protocol_for("cpu")
    outcome = _prompt_outcome(optimized_ms)
    prefill = None
    per_call = 0.6 if prefill_first_ms is None or prefill_first_ms < 1 else prefill_first_ms
    if prefill_first_ms is not None:
        prefill = {"first": {"baseline": 1.0e-3, "aa": 1.0e-3, "optimized": prefill_first_ms * 1e-3},
                   "all": {"baseline": 1.0e-3, "aa": 1.0e-3, "optimized": per_call * 1e-3}}
    modelaudit._judge_prompt(outcome, protocol, prefill, seed=3)
    assert (outcome.verdict == "rejected") == rejected, outcome.prompt
    expected_scale = 1.0 if prefill is None else min(prefill_first_ms, modelaudit.PROMPT_SCALE_CAP * per_call, 1.0)
    assert outcome.prompt["scale"] == pytest.approx(expected_scale)
    assert ("prefill phase" in outcome.prompt["basis"]) == (prefill is not None)


@pytest.mark.parametrize("optimized_call_ms, optimized_first_ms, rejected", [
    # Eager: 1.0 ms a billed step, 1.9 ms for the first after the prompt (0.9 ms of cold caches).
    (1.0, 1.9, False),   # the same model
    # The honest compiled Mamba at 2x512 (2026-12-06): a 1.6x faster step paying the same cold
    # 0.9 ms. Its ratio 2.44 against eager's 1.9 was refused by the ratio rule; in seconds it is 0.
    (0.625, 1.525, False),
    (0.625, 1.525 + 0.2, False),  # 0.2 ms more: 0.32 of its calls, inside the allowance
    (0.625, 1.525 + 0.5, True),   # 0.5 ms of hidden work (0.8 of its calls)
    (0.625, 0.625 + 0.5, False),  # caches warmed in the prompt's window: the cold time buys 0.5 ms
    (0.625, 0.625 + 1.4, True),   # and no more than that and the allowance
    (1.5, 2.4, False),            # slower than eager: the same cold time, no excess
])
def test_decodes_unbilled_first_call_is_judged_in_seconds_of_work_beyond_the_trusted_workers(
        optimized_call_ms, optimized_first_ms, rejected):
    from runners import modelaudit

    outcome = modelaudit._PhaseOutcome("decode")
    rounds = 12
    jitter = [1 + 0.01 * (r % 3) for r in range(rounds)]
    outcome.unbilled_s = {
        "baseline": [(1.9e-3 * j, 1.0e-3 * j) for j in jitter],
        "aa": [(1.9e-3 / j, 1.0e-3 / j) for j in jitter],
        "optimized": [(optimized_first_ms * 1e-3 * j, optimized_call_ms * 1e-3 * j) for j in jitter],
    }
    modelaudit._judge_unbilled_call(outcome, measure.protocol_for("cpu"), seed=5)
    assert (outcome.verdict == "rejected") == rejected, outcome.unbilled_excess
    expected = (optimized_first_ms - optimized_call_ms - 0.9) / optimized_call_ms
    assert outcome.unbilled_excess[0] == pytest.approx(expected, abs=0.05)
    if rejected:
        assert [r.code for r in outcome.reasons] == ["integrity.unbilled_call_slow"]


def test_work_aimed_at_the_other_workers_windows_cannot_run_there(sample_models):
    # Where the host freezes a tree, every arm is stopped while another is measured: the burner
    # thread gets no CPU in the trusted arms' windows, so it cannot slow them.
    prefill = _phase(_audit(sample_models["llama"], None, transform_source=INTERFERES, phases=("prefill",), rounds=6), "prefill")
    assert prefill["frozen_between_samples"] is True
    meanwhile = prefill["cpu_while_others_measured_s"]
    assert meanwhile["optimized"] <= max(meanwhile["baseline"], meanwhile["aa"]) + 0.0001, meanwhile
    assert not (prefill["billable"] and prefill["ci95"][0] > 1.0), prefill["ci95"]


def test_work_in_the_other_workers_windows_is_judged_where_workers_cannot_be_frozen(sample_models, monkeypatch):
    from runners import modelaudit
    monkeypatch.setattr(modelaudit, "_freezes", lambda sandbox, device: False)
    prefill = _phase(_audit(sample_models["llama"], None, transform_source=INTERFERES, phases=("prefill",), rounds=6), "prefill")
    assert prefill["frozen_between_samples"] is False
    assert prefill["verdict"] == "rejected" and [r["code"] for r in prefill["reasons"]] == ["integrity.background_cpu"]
    assert "while other workers were measured" in prefill["reasons"][0]["message"]
    assert prefill["cpu_while_others_measured_s"]["optimized"] > 0.0005


# Leaves interrupts behind for the windows after its own: from the reply to its sample's last call
# until its next sample's first call, a thread sleeps 0.4 ms at a time. Each wake-up costs it a few
# microseconds of CPU. (Until 2026-12-06: 48 sleepers re-armed at the end of every sample, expiring
# from 2 ms to 21 ms later; on CI's machine they missed the trusted windows often enough to be
# accepted once, and sometimes landed in the optimized worker's own next window.)
WAKE_STORM = """
import threading
import time
import runners.audit.model_worker as mw

# From the reply to its sample's last call until its next sample's first call, a thread of the
# optimized worker sleeps 0.4 ms at a time: every wake-up is a timer interrupt on a measurement
# core, landing in whichever trusted arm is measured meanwhile and never in its own window.
_storm = threading.Event()

def _storming():
    while True:
        _storm.wait()
        time.sleep(0.0004)

threading.Thread(target=_storming, daemon=True).start()

_step, _prepare = mw.ModelRunner.op_step, mw.ModelRunner.op_prepare

def op_prepare(self, header, tensors):
    self.last_call = int(header["calls"]) - 1
    return _prepare(self, header, tensors)

def op_step(self, header, tensors):
    if int(header["call"]) == 0:
        _storm.clear()
    reply = _step(self, header, tensors)
    if int(header["call"]) == self.last_call:
        _storm.set()
    return reply

mw.ModelRunner.op_step, mw.ModelRunner.op_prepare = op_step, op_prepare

def transform(model):
    return model
"""


def test_interrupts_left_for_the_other_workers_windows_are_judged_where_workers_cannot_be_frozen(sample_models, monkeypatch):
    # Frozen (with a stop signal first), each sleeper's timer is cancelled and its sleep resumes in
    # the worker's own time; without a freezer the wake-ups land in the trusted arms' windows.
    from runners import modelaudit
    monkeypatch.setattr(modelaudit, "_freezes", lambda sandbox, device: False)
    # The storm's own CPU while idle and in the others' windows (0.6-0.7 ms a round) is rejected
    # first (the idle allowance is 0.1 ms + 2%, the interference one 0.5 ms); loosened here so that
    # the interrupt judgement is what is tested.
    loose = dataclasses.replace(measure.protocol_for("cpu-ci"), background_cpu_abs_s=0.05, background_cpu_rel=0.5,
                                interference_abs_s=0.01)
    prefill = _phase(_audit(sample_models["llama"], None, transform_source=WAKE_STORM, phases=("prefill",), rounds=30,
                            protocol=loose), "prefill")
    assert prefill["verdict"] == "rejected" and not prefill["billable"]
    assert [r["code"] for r in prefill["reasons"]] == ["integrity.interrupts_in_other_arms"], (prefill["reasons"], prefill["left_behind"])
    assert prefill["left_behind"]["interrupts_per_ms_extra_in_trusted"][1] > measure.protocol_for("cpu-ci").interrupt_excess_per_ms


# A forward whose signature hides its parameters (red team 12, 2026-12-06): the worker read how to
# call a model from its own signature, so this one's prefill was called without the attention mask
# and without the cache a generating model's prefill builds, a cheaper workload than the baseline's
# (accepted, billable in single seeds with work hidden in the allowances). Here it refuses any call
# that is not made as the baseline's are.
SIGNATURE_HIDDEN = """
def transform(model):
    forward = model.forward

    def hidden(input_ids=None, **kwargs):
        if "attention_mask" not in kwargs or not ({"use_cache", "past_key_values"} & set(kwargs)):
            raise RuntimeError("called unlike the baseline: " + ", ".join(sorted(kwargs)))
        return forward(input_ids=input_ids, **kwargs)

    model.forward = hidden
    return model
"""


def test_the_optimized_model_is_called_as_the_baseline_calls_the_unmodified_one(sample_models):
    report = _audit(sample_models["llama"], None, transform_source=SIGNATURE_HIDDEN, rounds=3)
    for phase in report["phases"]:
        assert phase["verdict"] == "accepted", (phase["phase"], phase["reasons"])


# Work after the last reply (the model-audit form of tests/runners/cheats/adv10_after_reply.py): once
# its sample's last call is answered, the worker keeps its core busy until it is frozen or asked
# again (at most 3 ms), where an honest worker sleeps in its receive. Before 2026-12-06 that CPU was
# booked with the sample's windows, which nothing judges against the trusted workers.
AFTER_LAST_REPLY = """
import select
import time
import runners.audit.model_worker as mw
import runners.sandbox.zygote as zygote

_step, _prepare, _receive = mw.ModelRunner.op_step, mw.ModelRunner.op_prepare, zygote.recv_message
_answered = [False]

def op_prepare(self, header, tensors):
    self.last_call = int(header["calls"]) - 1
    return _prepare(self, header, tensors)

def op_step(self, header, tensors):
    reply = _step(self, header, tensors)
    _answered[0] = int(header["call"]) == self.last_call
    return reply

def recv_message(sock, *args, **kwargs):
    if _answered[0]:
        _answered[0] = False
        until = time.perf_counter() + 0.003
        total = 0
        while time.perf_counter() < until and not select.select([sock], [], [], 0)[0]:
            for step in range(200):
                total += step
    return _receive(sock, *args, **kwargs)

mw.ModelRunner.op_step, mw.ModelRunner.op_prepare, zygote.recv_message = op_step, op_prepare, recv_message

def transform(model):
    return model
"""


def test_cpu_after_a_samples_last_reply_is_judged_as_idle_cpu(sample_models, monkeypatch):
    # The freeze follows the reply within about 0.1 ms (measured 2026-12-06: 110-125 us against the
    # trusted workers' 30-45 us), inside the idle allowance (0.1 ms + 2% of the window CPU): the
    # room is bounded and accepted, and it is counted where the allowance applies.
    # The booking is checked where it happens (the ledger's moves), not through the idle estimate:
    # a difference of 0.1 ms per round is inside that estimate's round-to-round noise on a loaded
    # box (over 8 rounds its interval spanned +-130 us; over 15 its point once read -6 us in CI).
    moved: dict[int, list[int]] = {}
    original = measure.CpuLedger.move

    def move(self, worker, ns, source, target):
        bucket = self.rounds[-1].get(worker.pid) or {}
        before = bucket.get(target, 0)
        original(self, worker, ns, source, target)
        if (source, target) == ("window", "idle"):
            moved.setdefault(worker.pid, []).append(self.rounds[-1].get(worker.pid, {}).get(target, 0) - before)

    monkeypatch.setattr(measure.CpuLedger, "move", move)
    prefill = _phase(_audit(sample_models["llama"], None, transform_source=AFTER_LAST_REPLY, phases=("prefill",), rounds=8), "prefill")
    assert prefill["verdict"] == "accepted", prefill["reasons"]
    assert prefill["frozen_between_samples"] is True
    after = prefill["cpu_after_last_reply_s"]
    excess = after["optimized"] - max(after["baseline"], after["aa"])
    assert excess > 0.00004, after
    # Every sample's after-reply CPU was moved from its window to idle CPU, in full: the optimized
    # worker's moves (the largest) add up to its measured after-reply time.
    medians = sorted(sorted(v)[len(v) // 2] / 1e9 for v in moved.values())
    assert len(medians) == 3 and all(len(v) >= 8 for v in moved.values()), moved
    assert medians[-1] == pytest.approx(after["optimized"], rel=0.5), (medians, after)
    # And the idle estimate, where the allowance is judged, is consistent with it.
    idle = prefill["background_cpu"]["idle_s"]
    assert idle[2] > 0.3 * excess, (idle, after)
    assert prefill["background_cpu"]["idle_allowed_s"] < 0.0005


def _left_behind(rounds: list[tuple[tuple[str, ...], dict[str, float], dict[str, float]]]):
    """An accepted phase's outcome with these measured rounds (order, per-call seconds, interrupts
    per ms), judged by what the optimized worker leaves behind."""
    from runners.audit.model_sample import ModelSample
    from runners.modelaudit import _judge_left_behind, _PhaseOutcome

    outcome = _PhaseOutcome("prefill")
    for order, per_call, rates in rounds:
        samples = {label: ModelSample(calls=1, per_call_s=per_call[label], window_ns=int(per_call[label] * 1e9), preempted_ns=0,
                                      cpu_run_ns=0, clock_problem=None, checksums=[], metas=[],
                                      interrupts=round(rates[label] * per_call[label] * 1e3), interrupts_ns=int(per_call[label] * 1e9))
                   for label in order}
        outcome.measured_rounds.append((order, samples))
    _judge_left_behind(outcome, measure.protocol_for("cpu-ci"), seed=3)
    return outcome


def _orders(n: int) -> list[tuple[str, ...]]:
    cycle = [("optimized", "baseline", "aa"), ("optimized", "aa", "baseline"), ("baseline", "aa", "optimized")]
    return [cycle[i % 3] for i in range(n)]


def test_what_the_optimized_worker_leaves_behind_is_judged_from_the_rounds_orders():
    import random

    rng = random.Random(5)
    noise = lambda: 0.006 * (1 + rng.gauss(0, 0.01))  # noqa: E731
    quiet = {"optimized": 0.3, "baseline": 0.3, "aa": 0.3}
    honest = _left_behind([(order, {k: noise() for k in order}, quiet) for order in _orders(18)])
    assert honest.verdict == "accepted" and honest.reasons == []
    assert honest.left_behind["next_arm_slowdown"][1] < 1.05 and honest.left_behind["interrupts_per_ms_extra_in_trusted"][0] < 0.1
    # Interrupts in the trusted arms' windows, 2 per ms beyond its own.
    storm = _left_behind([(order, {k: noise() for k in order}, {**quiet, "baseline": 2.3, "aa": 2.3}) for order in _orders(18)])
    assert [r.code for r in storm.reasons] == ["integrity.interrupts_in_other_arms"]
    # Whichever trusted arm comes right after it runs 15% slower.
    def slowed(order):
        follower = order[order.index("optimized") + 1] if order.index("optimized") + 1 < len(order) else None
        return {k: noise() * (1.15 if k == follower else 1.0) for k in order}
    left = _left_behind([(order, slowed(order), quiet) for order in _orders(18)])
    assert [r.code for r in left.reasons] == ["integrity.slows_next_arm"]
    assert left.left_behind["next_arm_slowdown"][1] > 1.05
    # Too few rounds to judge: recorded as nothing, never a verdict.
    assert _left_behind([(order, slowed(order), quiet) for order in _orders(2)]).verdict == "accepted"


def test_it_reports_an_optimized_side_that_fails_to_load_as_an_error(sample_models):
    report = _audit(sample_models["llama"], None, transform_source="def transform(model):\n    raise RuntimeError('boom')\n",
                    phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "error" and prefill["reasons"][0]["code"] == "sandbox.import_error"
    assert "boom" in prefill["reasons"][0]["message"] and not prefill["billable"]
    assert _phase(report, "decode")["verdict"] == "skipped"


@pytest.mark.parametrize("family, skipped_because", [("gpt2", None), ("bert", "does not generate"), ("t5", None), ("mamba", None)])
def test_it_audits_other_architectures_and_skips_decode_without_a_next_token_step(tmp_path, family, skipped_because):
    # t5's prefill: the encoder over the prompt and the decoder's first step, one row per batch entry
    # (the rows checked are those the trusted baseline answered, not `seq` of them); its decode: the
    # decoder's next token over its cache and the encoder output kept from the prompt.
    folder = write_sample_model(tmp_path / family, family)
    report = _audit(folder, None, rounds=2)
    assert _phase(report, "prefill")["verdict"] == "accepted", _phase(report, "prefill")["reasons"]
    assert _phase(report, "decode")["verdict"] == ("skipped" if skipped_because else "accepted")
    if skipped_because:
        assert skipped_because in _phase(report, "decode")["note"] and report["notes"]
    else:  # a recurrent state (mamba) takes one token per step and bills from the second call
        recurrent = family == "mamba"
        assert _phase(report, "decode")["inputs"]["first_call_new_tokens"] == (1 if recurrent else 2)
        assert _phase(report, "decode")["billed_from_call"] == (1 if recurrent else 0)


def test_it_refuses_what_cannot_be_audited_before_starting_workers(sample_models, tmp_path):
    with pytest.raises(ValueError, match="positions"):
        _audit(sample_models["llama"], seq=10_000)
    with pytest.raises(ValueError, match="unknown phase"):
        _audit(sample_models["llama"], phases=("generate",))
    with pytest.raises(ValueError, match="schema"):
        _audit(sample_models["llama"], {"schema": "something/else"})
    with pytest.raises(ValueError):
        _audit(tmp_path / "missing")


@pytest.mark.slow  # the optimized worker compiles the whole model with Inductor: ~45 s on two cores
def test_it_measures_a_compiled_artifact_without_mistaking_its_compiler_for_hidden_work(llama_artifact, sample_models):
    # What optimize_model emits when whole-model torch.compile wins its quick estimate with the
    # variant test runners search (tests/conftest.py): the C++ wrapper, module guards dropped,
    # automatic dynamic shapes (decode's growing cache compiles once more as symbolic).
    compiled = {**llama_artifact.to_dict(), "strategy": Strategy.COMPILE,
                "compile": {"options": {"cpp_wrapper": True}, "guards": "fixed-modules"}}
    report = _audit(sample_models["llama"], compiled, rounds=6)
    assert report["artifact_strategy"] == "whole-model-compile"
    # Dynamo's objects from the first call must not make preparing look like hidden work, nor the
    # compiled model's own prefill of decode's caches.
    for phase in report["phases"]:
        assert phase["verdict"] == "accepted", (phase["phase"], phase["reasons"])
        assert phase["speedup"] > 0 and 0 <= phase["correctness"]["worst_ratio"] <= 1.0


def test_an_artifact_is_applied_in_the_sandbox_by_its_own_applier_and_its_failure_is_its_own(sample_models,
                                                                                            llama_artifact):
    """The judge imports no optimizer code: the artifact's applier runs in the optimized worker, so an
    artifact made for another config fails there, as the artifact's error, not the harness's."""
    altered = llama_artifact.to_dict()
    altered["model"] = {**altered["model"], "config_sha256": "0" * 64}
    report = _audit(sample_models["llama"], altered, phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "error" and prefill["reasons"][0]["code"] == "sandbox.import_error"
    assert "applying the optimization artifact" in prefill["reasons"][0]["message"]
    assert "config differs" in prefill["reasons"][0]["message"]


def test_an_artifact_document_is_checked_before_any_worker_starts():
    from runners.artifact import applier_source, artifact_document

    with pytest.raises(ValueError, match="is not 'dyno.optimization-artifact/1'"):
        artifact_document({"schema": "dyno.optimization-artifact/0"})
    with pytest.raises(ValueError, match="lacks model, device"):
        artifact_document({"schema": "dyno.optimization-artifact/1"})
    full = {"schema": "dyno.optimization-artifact/1", "model": {}, "device": "cpu", "hardware": "h", "versions": {},
            "workload": {}, "strategy": "baseline", "modules": [], "kernels": {}}
    with pytest.raises(ValueError, match="applier"):
        artifact_document({**full, "applier": "os:system; rm -rf"})
    source = applier_source(artifact_document(full))
    assert "from optimizer.model import apply as _apply" in source
    namespace: dict = {}
    exec(compile(source.replace("from optimizer.model import apply as _apply",
                                "_apply = lambda model, artifact: ('applied', artifact['strategy'])"), "t", "exec"), namespace)
    assert namespace["transform"]("m") == ("applied", "baseline")


def test_a_phase_measures_more_rounds_where_they_fit_in_its_budget():
    cpu = measure.protocol_for("cpu")
    assert _phase_rounds(cpu, 0.012) == 3 * cpu.rounds  # a small model: three times the rounds
    assert _phase_rounds(cpu, PHASE_BUDGET_S / 6 / 45) == 45  # as many as fit
    assert _phase_rounds(cpu, 2.0) == cpu.rounds  # a large one: never fewer than the protocol's
    assert _phase_rounds(measure.protocol_for("cpu-ci"), 0.006) == measure.protocol_for("cpu-ci").rounds


@pytest.mark.slow  # the reference worker compiles the model with Inductor
def test_reference_points_are_measured_in_the_same_rounds_and_one_that_fails_is_left_out(sample_models, monkeypatch):
    import runners.modelaudit as modelaudit

    monkeypatch.setitem(modelaudit.REFERENCE_POINTS, "broken", "def transform(model):\n    raise RuntimeError('no compiler')\n")
    report = _audit(sample_models["llama"], None, phases=("prefill",), rounds=4, reference_points=("torch-compile", "broken"))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "accepted", prefill["reasons"]
    assert report["reference_points"] == ["torch-compile", "broken"]
    assert any("reference point broken left out" in note and "no compiler" in note for note in report["notes"])
    assert "torch-compile" in prefill["reference_points"], (prefill["notes"], report["notes"])
    compiled = prefill["reference_points"]["torch-compile"]
    assert set(prefill["reference_points"]) == {"torch-compile"} and len(prefill["samples_s"]["ref:torch-compile"]) == 4
    low, high = compiled["ci95"]
    assert low <= compiled["speedup_over_eager"] <= high and compiled["median_s"] > 0
    # The artifact (none here: eager) against the free compiler, from the same rounds.
    # Paired ratios of the same rounds: over eager through the reference is about over eager directly.
    chained = compiled["speedup_over_eager"] * compiled["artifact_over_reference"]
    assert chained == pytest.approx(prefill["speedup"], rel=0.25)
    assert compiled["artifact_over_reference_ci95"][0] <= compiled["artifact_over_reference"] <= compiled["artifact_over_reference_ci95"][1]
    with pytest.raises(ValueError, match="unknown reference point"):
        _audit(sample_models["llama"], None, reference_points=("tensorrt",))


def test_a_reply_without_one_floating_vector_commits_to_nothing():
    import torch

    from runners.audit.model_sample import _commitment

    assert _commitment(torch.tensor([1.5, -2.0], dtype=torch.float32)) == [1.5, -2.0]
    for tensor in (None, torch.tensor([1, 2]), torch.zeros(2, 3), torch.zeros(())):
        assert _commitment(tensor) == []  # the check then fails the call: integrity.commitment_mismatch


@pytest.mark.parametrize("family, several", [("llama", True), ("t5", True), ("mamba", False)])
def test_a_decode_step_of_several_tokens_equals_as_many_steps_of_one(tmp_path, family, several):
    # The trusted worker's own steps, in this process: decode's first call appends two tokens at once
    # where the cache is keys and values; a recurrent state takes one at a time.
    import torch

    from runners.audit.model_worker import ModelRunner

    folder = write_sample_model(tmp_path / family, family)
    runners = [ModelRunner("cpu"), ModelRunner("cpu")]
    request = {"phase": "decode", "seed": 3, "calls": 4, "vocab": 256, "batch": BATCH, "seq": SEQ, "commit_seed": 5}
    loads = []
    for runner in runners:
        loads.append(runner.op_load({"model_dir": str(folder), "probe_decode": True}, [])[0])
        assert runner.op_prepare(request, []) == ({}, [])  # nothing of the round's tokens before its calls
    assert loads[0]["first_step_tokens"] == (2 if several else 1)
    with pytest.raises(ValueError, match="prompt carries"):
        runners[0].op_step({"call": 0}, [_ids(0, 7, 9)])  # call 0 is the prompt: a step's tokens are not one
    prompt = [0, *range(3, 3 + BATCH * SEQ)]
    reply = runners[0].op_step({"call": 0}, [_ids(*prompt)])
    assert reply[0]["meta"][0]["shape"][:2] == ([BATCH, 1] if family == "t5" else [BATCH, SEQ])
    # The commitment is the reply's one raw float32 vector, a checksum per output row, not JSON numbers
    assert "checksums" not in reply[0] and len(reply[1]) == 1 and reply[1][0].dtype == torch.float32
    assert reply[1][0].shape == (BATCH * reply[0]["meta"][0]["shape"][1],)
    runners[1].op_step({"call": 0}, [_ids(*prompt)])
    if not several:
        return
    first, second, third = [7, 9], [11, 13], [17, 19]
    together = runners[0].op_step({"call": 1}, [_ids(0, first[0], second[0], first[1], second[1])])
    assert runners[0].next_request_soon  # the sample's next step follows: its loop polls for it
    after = runners[0].op_step({"call": 2}, [_ids(0, *third)])
    for call, tokens in enumerate((first, second, third), start=1):
        runners[1].handle("step", {"call": call}, [_ids(0, *tokens)])
    assert not runners[1].next_request_soon  # the last of its four: it sleeps until the next request
    assert together[0]["meta"][0]["shape"] == [BATCH, 2, 256] and after[0]["meta"][0]["shape"] == [BATCH, 1, 256]
    one_by_one = torch.cat(runners[1].outputs[1:3], dim=1)
    torch.testing.assert_close(runners[0].outputs[1], one_by_one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(runners[0].outputs[2], runners[1].outputs[3], atol=1e-5, rtol=1e-5)
