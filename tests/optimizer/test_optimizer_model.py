"""Model-level optimization on tiny real transformers models: module mapping, end-to-end checks,
fallbacks, the artifact, and apply() in a fresh process-like setting (a freshly loaded model)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import optimizer
from optimizer.model import (
    ARTIFACT_SCHEMA,
    DECODE_PROBE_STEPS,
    FALLBACK,
    ArtifactMismatch,
    OptimizationArtifact,
    Status,
    Strategy,
    compare_outputs,
    example_model_inputs,
    load_model,
    optimize_model,
    remove,
)
from optimizer.cache import JsonlTuningCache, MemoryTuningCache, TuningEntry
from optimizer.model import strategy_key
from optimizer.search import default_hardware
from runners.samples import write_sample_model


def scripted_timer(*estimates: float, decode: dict[int, float] | None = None):
    """Stands in for the quick timer: runs the candidate once and returns the next prefill estimate
    (optimize_model times the baseline first, then the patched model, then each whole-model
    compile variant followed by the baseline again);
    a strategy's decode step gets its prefill estimate, or `decode[i]` for the i-th strategy (the
    timer times a DECODE_PROBE_STEPS-step generation; the probe divides)."""
    it = iter(estimates)
    seen: list[float] = []

    def timer(fn, prepare=None):
        if prepare is not None:
            fn(**prepare())
            return (decode or {}).get(len(seen) - 1, seen[-1]) * DECODE_PROBE_STEPS
        fn()
        seen.append(next(it))
        return seen[-1]

    return timer


@pytest.fixture(autouse=True)
def fresh_kernels(monkeypatch):
    """Each test loads kernels anew: the process-wide kernel cache would otherwise hand a test the
    kernel another test compiled from the same source before a monkeypatch."""
    import optimizer.model as model_module

    monkeypatch.setattr(model_module, "_KERNEL_CACHE", {})


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {f: write_sample_model(root / f, f) for f in ("llama", "mistral", "mixtral", "mamba", "gpt2", "bert", "qwen2")}


def outputs(model: torch.nn.Module, batch: int = 2, seq: int = 11) -> torch.Tensor:
    with torch.no_grad():
        return model(**example_model_inputs(model, batch=batch, seq=seq, seed=5)).logits


@pytest.mark.parametrize("family,expected", [
    ("llama", {"rmsnorm", "swiglu"}),
    ("mistral", {"rmsnorm", "swiglu"}),
    ("mixtral", {"rmsnorm", "moe"}),
    ("mamba", {"rmsnorm", "ssm_scan"}),
])
def test_it_patches_supported_modules_and_apply_reproduces_the_model(models, family, expected, tmp_path):
    artifact = optimize_model(models[family], batch=2, seq=16, try_compile=False, timer=scripted_timer(1.0, 0.5))
    assert artifact.strategy == Strategy.PATCHED
    optimized = [m for m in artifact.modules if m.status == Status.OPTIMIZED]
    assert {m.family for m in optimized} == expected
    assert all(m.source_sha256 in artifact.kernels for m in optimized)
    assert artifact.verification[Strategy.PATCHED]["passed"] is True

    path = tmp_path / "artifact.json"
    artifact.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == ARTIFACT_SCHEMA and data["model"]["architecture"]

    fresh = load_model(models[family])
    expected_out = outputs(fresh)
    applied = optimizer.apply(fresh, path)
    patched = [n for n, m in applied.named_modules() if getattr(m, "_dyno_kernel_sha256", None)]
    assert sorted(patched) == sorted(m.module for m in optimized)
    # Another batch and sequence length than the artifact was made at: kernels are shape-generic.
    check = compare_outputs(outputs(applied, batch=1, seq=7), outputs(remove(load_model(models[family])), 1, 7))
    assert check["passed"], check
    assert compare_outputs(outputs(applied), expected_out)["passed"]
    remove(applied)
    assert not [n for n, m in applied.named_modules() if getattr(m, "_dyno_kernel_sha256", None)]


def test_it_lists_unsupported_modules_as_fallbacks_with_a_reason(models):
    artifact = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5))
    fallback = {m.module: m for m in artifact.modules if m.status == Status.FALLBACK}
    assert fallback["model.layers.0.self_attn"].family == "attention_prefill"
    assert fallback["model.layers.0.self_attn.q_proj"].family == "gemm"
    assert all(FALLBACK in m.reason for m in fallback.values())


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_it_keeps_the_baseline_for_models_without_tuned_kernels(models, family):
    artifact = optimize_model(models[family], batch=2, seq=8, try_compile=False)
    assert artifact.strategy == Strategy.BASELINE and artifact.kernels == {}
    statuses = {m.status for m in artifact.modules}
    assert Status.OPTIMIZED not in statuses
    mlp = [m for m in artifact.modules if m.module_class in ("GPT2MLP", "BertIntermediate")]
    assert mlp and all(m.status == Status.FALLBACK and "SiLU" in m.reason for m in mlp)
    norms = [m for m in artifact.modules if m.family == "layernorm"]
    assert norms and all(m.status == Status.BASELINE for m in norms)
    model = load_model(models[family])
    before = outputs(model)
    assert torch.equal(outputs(optimizer.apply(model, artifact.to_dict())), before)


def test_it_drops_a_family_whose_kernel_breaks_the_model(models, monkeypatch):
    import optimizer.kernels.swiglu as swiglu

    monkeypatch.setattr(swiglu, "swiglu_torch", lambda gate, up: gate * up)  # drops the SiLU
    artifact = optimize_model(models["qwen2"], batch=2, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5))
    mlp = [m for m in artifact.modules if m.family == "swiglu"]
    assert mlp and all(m.status == Status.FALLBACK and "end-to-end check failed" in m.reason for m in mlp)
    norms = [m for m in artifact.modules if m.family == "rmsnorm"]
    assert norms and all(m.status == Status.OPTIMIZED for m in norms)
    assert artifact.verification[Strategy.PATCHED]["dropped_families"] == ["swiglu"]


def test_it_turns_a_kernel_that_fails_to_run_into_a_fallback(models, monkeypatch):
    import optimizer.kernels.rmsnorm as rmsnorm

    def broken(x, weight, eps):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(rmsnorm, "rmsnorm_torch", broken)
    artifact = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5))
    norms = [m for m in artifact.modules if m.family == "rmsnorm"]
    assert norms and all(m.status == Status.FALLBACK and "kernel launch failed" in m.reason for m in norms)


def test_it_refuses_an_artifact_for_another_model_config_or_device(models):
    artifact = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5))
    with pytest.raises(ArtifactMismatch, match="artifact is for"):
        optimizer.apply(load_model(models["mamba"]), artifact)
    other = load_model(models["llama"])
    other.config.rms_norm_eps = 1e-3
    with pytest.raises(ArtifactMismatch, match="config differs"):
        optimizer.apply(other, artifact)
    gpu = OptimizationArtifact.from_dict({**artifact.to_dict(), "device": "cuda"})
    with pytest.raises(ArtifactMismatch, match="device"):
        optimizer.apply(load_model(models["llama"]), gpu)


def test_it_refuses_an_altered_kernel_source(models):
    artifact = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5))
    data = artifact.to_dict()
    sha = next(iter(data["kernels"]))
    data["kernels"][sha] = data["kernels"][sha].replace("return", "return 0 *")
    with pytest.raises(ArtifactMismatch, match="altered"):
        optimizer.apply(load_model(models["llama"]), data)
    with pytest.raises(ArtifactMismatch, match="schema"):
        optimizer.apply(load_model(models["llama"]), {**data, "schema": "something/0"})


def test_it_optimizes_an_unsupported_architecture_without_crashing(tmp_path):
    import transformers

    config = transformers.OPTConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, ffn_dim=64,
                                    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32)
    model = transformers.OPTForCausalLM(config).eval()
    artifact = optimize_model(model, batch=1, seq=8, try_compile=False)
    assert artifact.strategy == Strategy.BASELINE
    assert any("no module maps to a tuned kernel" in n for n in artifact.notes)
    assert all(m.status != Status.OPTIMIZED for m in artifact.modules)


@pytest.mark.parametrize("threads", [1, 2])
def test_it_estimates_at_the_thread_count_the_audit_runs_at(models, threads):
    # A strategy chosen at another thread count than its audit's can win the estimate and lose
    # the audit; every timed estimate runs at `threads`, and the caller's count is restored.
    seen: list[int] = []

    def timer(fn, prepare=None):
        seen.append(torch.get_num_threads())
        fn(**prepare()) if prepare else fn()
        return 1.0

    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        artifact = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=timer, threads=threads)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(previous)
    assert len(seen) >= 2 and set(seen) == {threads}  # the unmodified model and the patched one
    assert artifact.estimates["threads"] == threads


def never_timed(fn):
    raise AssertionError("a cached strategy decision was timed again")


def test_a_second_model_of_the_same_architecture_reuses_the_strategy_decision(models, tmp_path):
    # Another customer's weights, the same architecture and shape: the decision is reused without
    # timing anything; its patches are verified on the new weights and deploy as before.
    cache = JsonlTuningCache(tmp_path / "tuning.jsonl")
    first = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5),
                           cache=cache, threads=1)
    assert first.strategy == Strategy.PATCHED and "from_cache" not in first.estimates
    other = write_sample_model(tmp_path / "other-llama", "llama", seed=3)
    second = optimize_model(other, batch=1, seq=8, try_compile=False, timer=never_timed, cache=cache, threads=1)
    assert second.strategy == Strategy.PATCHED and second.kernels == first.kernels
    assert second.estimates["from_cache"]["estimated_speedup"] == pytest.approx(2.0)
    assert second.estimates["from_cache"]["estimates"]["patched-modules"] == 0.5
    assert any("from the tuning cache" in note for note in second.notes)
    assert second.verification[Strategy.PATCHED]["passed"]
    model = load_model(other)
    before = outputs(model)
    assert compare_outputs(outputs(optimizer.apply(model, second)), before)["passed"]


@pytest.mark.parametrize("change", [{"seq": 16}, {"threads": 2}, {"try_compile": True}])
def test_a_decision_is_reused_only_for_the_shape_threads_and_options_it_was_made_for(models, tmp_path, change):
    cache = JsonlTuningCache(tmp_path / "tuning.jsonl")
    options = dict(batch=1, seq=8, try_compile=False, threads=1)
    optimize_model(models["llama"], timer=scripted_timer(1.0, 0.5), cache=cache, **options)
    key = strategy_key(load_model(models["llama"]), batch=1, seq=8, device="cpu", hardware=default_hardware(),
                       threads=1, try_compile=False)
    assert cache.get(key).candidate == Strategy.PATCHED
    changed = {**options, **change}
    changed_key = strategy_key(load_model(models["llama"]), batch=1, seq=changed["seq"], device="cpu",
                               hardware=default_hardware(), threads=changed["threads"], try_compile=changed["try_compile"])
    assert changed_key.digest() != key.digest() and cache.get(changed_key) is None


def test_an_operator_narrows_the_compile_search_by_name_and_a_narrowed_decision_is_cached_apart(models):
    from optimizer.model import COMPILE_VARIANTS, compile_variants

    assert compile_variants(None) == compile_variants([]) == COMPILE_VARIANTS
    assert [name for name, _ in compile_variants(["freezing", "default"])] == ["default", "freezing"]
    with pytest.raises(ValueError, match="unknown compile variant.*'turbo'.*known: default, freezing"):
        compile_variants(["default", "turbo"])
    with pytest.raises(ValueError, match="'turbo'"):  # refused before the model is even loaded
        optimize_model(models["llama"], batch=1, seq=8, variants=["turbo"], timer=lambda fn: 1.0)
    model = load_model(models["llama"])
    key = functools.partial(strategy_key, model, batch=1, seq=8, device="cpu", hardware=default_hardware(), threads=1)
    everything = key(try_compile=True).digest()
    assert key(try_compile=True, variants=[name for name, _ in COMPILE_VARIANTS]).digest() == everything
    narrowed = key(try_compile=True, variants=["default"]).digest()
    assert narrowed != everything and narrowed != key(try_compile=True, variants=["freezing"]).digest()
    assert key(try_compile=False, variants=["default"]).digest() == key(try_compile=False).digest()


def test_a_cached_patch_strategy_that_fails_on_this_model_is_searched_again(models, tmp_path):
    # bert has no module a CPU kernel patches: a cached "patched" decision cannot hold for it.
    cache = MemoryTuningCache()
    model = load_model(models["bert"])
    key = strategy_key(model, batch=2, seq=8, device="cpu", hardware=default_hardware(), threads=1, try_compile=False)
    cache.put(key, TuningEntry(params={}, candidate=Strategy.PATCHED,
                               source_sha256=key.kernels_sha256, shape={"batch": 2, "seq": 8}, speedup_estimate=3.0,
                               tuning_seconds=1.0))
    timed: list[float] = []
    artifact = optimize_model(model, batch=2, seq=8, try_compile=False, cache=cache, threads=1,
                              timer=lambda fn: timed.append(1.0) or 1.0)
    assert timed and artifact.strategy == Strategy.BASELINE and "from_cache" not in artifact.estimates
    assert any("did not verify on this model; searched again" in note for note in artifact.notes)
    assert cache.get(key).candidate == Strategy.BASELINE  # the search's own decision replaces it


@pytest.mark.slow
def test_it_tries_whole_model_compile_configurations_and_applies_the_fastest(models):
    # Two of the variants (each is a compile of its own): estimates default compile 0.6, frozen
    # weights with the C++ wrapper 0.5; eager 0.45 first (alone, it would make every variant lose),
    # 2.0 after the default (against it alone, the default would win) and 1.0 after the other:
    # variants are judged against the median of eager's estimates, 1.0. The artifact deploys in a
    # freshly loaded model.
    # Named in any order, variants are tried in COMPILE_VARIANTS' order.
    artifact = optimize_model(models["gpt2"], batch=1, seq=8, try_compile=True,
                              variants=["freezing-cpp-wrapper", "default"], timer=scripted_timer(0.45, 0.6, 2.0, 0.5, 1.0))
    assert artifact.strategy == Strategy.COMPILE and artifact.verification[Strategy.COMPILE]["passed"]
    assert artifact.verification[Strategy.COMPILE]["variant"] == "freezing-cpp-wrapper"
    assert artifact.compile == {"options": {"freezing": True, "cpp_wrapper": True}}
    assert artifact.estimates["compile_variants"] == {"default": 0.6, "freezing-cpp-wrapper": 0.5}
    assert artifact.estimates["compile_variants_baseline"] == {"default": 2.0, "freezing-cpp-wrapper": 1.0}
    # The record says what the choice compared: the median of eager's three estimates, and the
    # compile's lower phase speedup over it.
    assert artifact.estimates["compile_variants_baseline_median"] == {"prefill": 1.0, "decode": 1.0}
    assert artifact.estimates["speedups"] == {Strategy.COMPILE: pytest.approx(2.0)}
    assert set(artifact.verification["compile_variants"]) == {"default", "freezing-cpp-wrapper"}
    assert artifact.verification[Strategy.COMPILE]["decode"]["passed"]  # checked on the decode step too
    assert artifact.estimates["compile_variants_decode"] == {"default": 0.6, "freezing-cpp-wrapper": 0.5}
    model = load_model(models["gpt2"])
    before = outputs(model, 1, 8)
    after = outputs(optimizer.apply(model, artifact), 1, 8)
    assert compare_outputs(after, before)["passed"]


def test_the_quick_estimate_takes_more_calls_of_a_short_forward_and_the_minimum_of_a_long_one():
    import time

    from optimizer.model import quick_time

    calls = []
    quick_time(lambda: calls.append(1), rounds=5, budget_s=10.0, max_rounds=40)
    assert len(calls) == 1 + 40  # a warm-up, then calls up to the cap while the budget lasts
    calls.clear()
    quick_time(lambda: (calls.append(1), time.sleep(0.02)), rounds=2, budget_s=0.05, max_rounds=40)
    assert 1 + 2 <= len(calls) <= 1 + 3  # the minimum, then only while the 50 ms budget lasts


def test_a_strategy_that_wins_prefill_and_loses_decode_is_not_chosen(models):
    # The audit bills the lower phase: patches estimated 2x on prefill and 0.83x on decode
    # (baseline 1.0 both) lose to the unmodified model; 2x and 1.25x win, estimated at 1.25x.
    losing = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5, decode={1: 1.2}))
    assert losing.strategy == Strategy.BASELINE
    assert losing.estimates["decode"] == {Strategy.BASELINE: 1.0, Strategy.PATCHED: 1.2}
    assert any("in both prefill and decode" in note for note in losing.notes)
    winning = optimize_model(models["llama"], batch=1, seq=8, try_compile=False, timer=scripted_timer(1.0, 0.5, decode={1: 0.8}),
                             cache=(cache := MemoryTuningCache()), threads=1)
    assert winning.strategy == Strategy.PATCHED
    key = strategy_key(load_model(models["llama"]), batch=1, seq=8, device="cpu", hardware=default_hardware(), threads=1,
                       try_compile=False)
    assert cache.get(key).speedup_estimate == pytest.approx(1.25)


def test_the_decode_probe_is_a_generation_over_a_fresh_prompt_cache_on_every_call(models):
    # As the end-to-end audit's decode sample: over a key/value cache the first step appends two
    # tokens, each later step one, the mask covering the cache and the step's tokens.
    from optimizer.model import example_decode_inputs

    model = load_model(models["llama"])
    inputs = example_model_inputs(model, batch=2, seq=8, seed=3)
    prepare = example_decode_inputs(model, inputs)
    first, second = prepare()["steps"], prepare()["steps"]
    assert len(first) == DECODE_PROBE_STEPS
    assert [s["input_ids"].shape for s in first] == [(2, 2)] + [(2, 1)] * (DECODE_PROBE_STEPS - 1)
    assert [s["attention_mask"].shape[1] for s in first] == [10 + i for i in range(DECODE_PROBE_STEPS)]
    assert first[0]["cache"] is not second[0]["cache"] and first[0]["cache"].get_seq_length() == 8
    with torch.no_grad():
        a = [model(**step).logits for step in first]
        b = [model(**step).logits for step in second]
    assert first[0]["cache"].get_seq_length() == 8 + 1 + DECODE_PROBE_STEPS
    assert a[0].shape == (2, 2, model.config.vocab_size) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert example_decode_inputs(load_model(models["bert"]), example_model_inputs(load_model(models["bert"]), batch=1, seq=4)) is None


def test_the_decode_probe_of_a_state_space_model_steps_one_token_without_a_mask(tmp_path):
    # Its cached steps take one token (transformers restarts the scan on a longer one) and its
    # generation passes no attention mask on them.
    from optimizer.model import example_decode_inputs

    model = load_model(write_sample_model(tmp_path / "mamba", "mamba"))
    steps = example_decode_inputs(model, example_model_inputs(model, batch=2, seq=8))()["steps"]
    assert [s["input_ids"].shape for s in steps] == [(2, 1)] * DECODE_PROBE_STEPS
    assert all("attention_mask" not in s for s in steps)


def test_compile_options_translate_the_guard_policy_and_refuse_an_unknown_one():
    from optimizer.model import FIXED_MODULES, _fixed_module_guards, compile_kwargs

    stored = {"dynamic": False, "options": {"cpp_wrapper": True}, "guards": FIXED_MODULES}
    assert compile_kwargs(stored) == {"dynamic": False, "options": {"cpp_wrapper": True, "guard_filter_fn": _fixed_module_guards}}
    assert stored["options"] == {"cpp_wrapper": True}  # the stored configuration is not altered
    assert compile_kwargs({}) == {}
    with pytest.raises(ArtifactMismatch, match="unknown guard policy 'none'"):
        compile_kwargs({"dynamic": False, "guards": "none"})


def test_the_call_around_a_compiled_forward_carries_the_options_beyond_torch_compile():
    from optimizer import attention
    from optimizer.model import FIXED_MODULES, _ArtifactCall

    model, compiled = torch.nn.Linear(2, 2), (lambda *args, **kwargs: None)
    plain = _ArtifactCall.wrap(model, compiled, {"dynamic": False, "options": {"cpp_wrapper": True}})
    assert isinstance(plain, _ArtifactCall) and not plain.fixed_modules and plain.switched is None
    fixed = _ArtifactCall.wrap(model, compiled, {"dynamic": False, "guards": FIXED_MODULES})
    assert isinstance(fixed, _ArtifactCall) and fixed.fixed_modules and fixed.switched is None
    switched = _ArtifactCall.wrap(model, compiled, {"dynamic": False, "attention": attention.POLICY})
    assert isinstance(switched, _ArtifactCall) and not switched.fixed_modules and switched.switched is not None


def test_a_compiled_forwards_cache_tensors_are_copied_out_of_the_graphs_buffers():
    """A cache tensor that is a slice of a graph's buffer (the compiled sample Mamba's convolution
    states held 64 MiB of a batch 8 x seq 512 prompt) would keep the buffer alive for a whole
    generation; the artifact's call copies it out, leaves compact ones alone, and the values stay."""
    from optimizer.model import _ArtifactCall

    class Layer:
        def __init__(self) -> None:
            buffer = torch.randn(8, 512, 1024)  # 16 MiB
            self.conv_states = {0: buffer[:, -4:, :]}  # 128 KiB of it
            self.recurrent_states = {0: torch.randn(8, 64)}
            self.keys = [buffer[:, :, :2]]  # a 32 KiB strided view of it

    class Cache:
        def __init__(self) -> None:
            self.layers = [Layer(), Layer()]

    cache = Cache()
    before = {id(layer): (layer.conv_states[0].clone(), layer.recurrent_states[0]) for layer in cache.layers}
    call = _ArtifactCall.wrap(torch.nn.Linear(2, 2), lambda **kwargs: {"logits": torch.zeros(1), "cache": cache}, {})
    out = call(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True)
    for layer in out["cache"].layers:
        conv, recurrent = layer.conv_states[0], layer.recurrent_states[0]
        assert conv.untyped_storage().nbytes() == conv.nbytes and torch.equal(conv, before[id(layer)][0])
        assert recurrent is before[id(layer)][1]  # compact already: the same tensor
        assert layer.keys[0].untyped_storage().nbytes() == layer.keys[0].nbytes
    # Without a cache asked for, nothing is touched.
    pinned = Cache()
    call = _ArtifactCall.wrap(torch.nn.Linear(2, 2), lambda **kwargs: {"cache": pinned}, {})
    call(input_ids=torch.zeros(1, 1, dtype=torch.long))
    assert pinned.layers[0].conv_states[0].untyped_storage().nbytes() == 16 << 20


@pytest.mark.slow
def test_a_fixed_modules_compile_keeps_input_guards_and_runs_uncompiled_when_the_model_changes(models, monkeypatch):
    # Module-attribute guards are dropped; the inputs' guards stay (another shape is compiled
    # again, not run through the first graph), a hook added later still fires, and training mode
    # sends the call to the uncompiled forward.
    import optimizer.model as model_module

    monkeypatch.setattr(model_module, "COMPILE_VARIANTS",
                        (("cpp-wrapper-fixed-modules", dict(model_module.COMPILE_VARIANTS)["cpp-wrapper-fixed-modules"]),))
    artifact = optimize_model(models["gpt2"], batch=1, seq=8, try_compile=True, timer=scripted_timer(1.0, 0.5, 1.0))
    assert artifact.strategy == Strategy.COMPILE and artifact.compile["guards"] == "fixed-modules"
    model = load_model(models["gpt2"])
    eager = {seq: outputs(model, 1, seq) for seq in (8, 6)}
    optimizer.apply(model, artifact)
    assert isinstance(model._compiled_call_impl, model_module._ArtifactCall)
    for seq in (8, 6):
        assert compare_outputs(outputs(model, 1, seq), eager[seq])["passed"]
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(type(out).__name__))
    outputs(model, 1, 8)
    assert seen == ["CausalLMOutputWithCrossAttentions"]
    model._forward_hooks.clear()
    # The sample's dropout (0.1) acts in training mode: two calls differ, where the compiled
    # evaluation graph (whose training-flag guards were dropped) would return the same logits.
    model.train()
    torch.manual_seed(0)
    first = outputs(model, 1, 8)
    torch.manual_seed(1)
    assert not torch.equal(first, outputs(model, 1, 8))
    model.eval()
    assert compare_outputs(outputs(model, 1, 8), eager[8])["passed"]


@pytest.mark.slow
def test_a_dyno_sdpa_compile_matches_the_model_with_and_without_padding_and_leaves_it_sdpa(models, monkeypatch):
    # Long enough for chunked causal prefill; the decode step is checked by the optimizer's probe.
    import optimizer.model as model_module
    from optimizer import attention

    monkeypatch.setattr(model_module, "COMPILE_VARIANTS", (("dyno-sdpa", {"dynamic": False, "attention": attention.POLICY}),))
    seq = attention.CHUNK_MIN + 8
    artifact = optimize_model(models["llama"], batch=1, seq=seq, try_compile=True, timer=scripted_timer(1.0, 0.6, 0.5, 1.0))
    assert artifact.strategy == Strategy.COMPILE and artifact.compile["attention"] == attention.POLICY
    assert artifact.verification[Strategy.COMPILE]["decode"]["passed"] is True
    model = load_model(models["llama"])
    ids = torch.randint(3, 200, (2, seq), generator=torch.Generator().manual_seed(4))
    padded = torch.ones_like(ids)
    padded[1, :40] = 0
    with torch.no_grad():
        expected = [model(input_ids=ids, attention_mask=m).logits for m in (torch.ones_like(ids), padded)]
        optimizer.apply(model, artifact)
        got = [model(input_ids=ids, attention_mask=m).logits for m in (torch.ones_like(ids), padded)]
    assert model.config._attn_implementation == "sdpa"  # switched inside the compiled call only
    assert compare_outputs(got[0], expected[0])["passed"]
    assert compare_outputs(got[1][0], expected[1][0])["passed"] and compare_outputs(got[1][1, 40:], expected[1][1, 40:])["passed"]
    eager_attention = load_model(models["llama"])
    eager_attention.set_attn_implementation("eager")
    with pytest.raises(ArtifactMismatch, match="runs 'eager', not SDPA"):
        optimizer.apply(eager_attention, artifact)


@pytest.mark.parametrize("family,expected", [("llama", {"rmsnorm", "swiglu"}), ("mixtral", {"rmsnorm", "moe"}),
                                             ("mamba", {"rmsnorm", "ssm_scan"})])
def test_it_verifies_gpu_artifacts_triton_kernels_in_the_model_under_the_interpreter(models, family, expected):
    # The model stays on CPU: under TRITON_INTERPRET=1 the GPU plan's Triton launchers run there,
    # which checks their wiring into real transformers modules (strided Mixtral experts included).
    artifact = optimize_model(load_model(models[family]), batch=2, seq=9, device="cuda", try_compile=False,
                              timer=scripted_timer(1.0, 0.5))
    assert artifact.verification[Strategy.PATCHED]["passed"] is True
    optimized = [m for m in artifact.modules if m.status == Status.OPTIMIZED]
    assert {m.family for m in optimized} == expected and {m.params["variant"] for m in optimized} == {"triton"}
