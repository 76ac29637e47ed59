"""Dyno's attention (optimizer/attention.py): masks decided outside the graph and chunked causal
prefill give the outputs transformers' SDPA gives, and leave the model as it was outside a call."""

from __future__ import annotations

import pytest
import torch
from transformers import masking_utils
from transformers.integrations import sdpa_attention

from optimizer import attention
from optimizer.model import ArtifactMismatch, compare_outputs, compile_kwargs, load_model
from runners.samples import write_sample_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write_sample_model(tmp_path_factory.mktemp("llama"), "llama")


def test_the_static_mask_is_skipped_only_where_eager_would_skip_it():
    base = dict(batch_size=2, mask_function=masking_utils.causal_mask_function, device="cpu")
    assert attention._static_mask(q_length=5, kv_length=5, **base) is None  # prefill: is_causal
    assert attention._static_mask(q_length=1, kv_length=9, q_offset=8, **base) is None  # one query sees all
    padded = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    cases = [
        dict(q_length=5, kv_length=5, attention_mask=padded),  # padding: the mask is built
        dict(q_length=3, kv_length=5, q_offset=2),  # a chunk after a prefix: causal offset
        dict(q_length=5, kv_length=5, local_size=3),  # a local window
    ]
    for case in cases:
        ours = attention._static_mask(**base, **case)
        theirs = masking_utils.sdpa_mask(**base, **case, allow_is_causal_skip=False)
        assert ours is not None and torch.equal(ours, theirs), case
    bidirectional = dict(base, mask_function=masking_utils.bidirectional_mask_function, allow_is_causal_skip=False)
    assert attention._static_mask(q_length=5, kv_length=5, allow_is_bidirectional_skip=True, **bidirectional) is None
    assert attention._static_mask(q_length=5, kv_length=5, allow_is_bidirectional_skip=True, attention_mask=padded,
                                  **bidirectional) is not None


class _Grouped(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 2


def test_chunked_causal_prefill_matches_sdpa_and_skips_the_masked_blocks(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    length = attention.CHUNK_MIN + 45  # not a multiple of the block
    query = torch.randn(2, 4, length, 16, generator=gen)
    key, value = (torch.randn(2, 2, length, 16, generator=gen) for _ in range(2))
    module = _Grouped()
    expected, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, None, scaling=0.25)
    calls = []
    real = sdpa_attention.sdpa_attention_forward

    def counted(module, q, k, v, mask, **kwargs):
        calls.append((q.shape[2], k.shape[2]))
        return real(module, q, k, v, mask, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", counted)
    got, _ = attention._chunked_sdpa(module, query, key, value, None, scaling=0.25)
    assert got.shape == expected.shape == (2, length, 4, 16)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    blocks = -(-length // attention.CHUNK_ROWS)
    assert len(calls) == blocks and calls[-1] == (length - (blocks - 1) * attention.CHUNK_ROWS, length)
    assert sum(q * k for q, k in calls) < 0.65 * length * length  # most of the masked half is not computed
    calls.clear()
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    attention._chunked_sdpa(module, query, key, value, mask, scaling=0.25)  # a mask: as transformers does
    attention._chunked_sdpa(module, query[:, :, :100], key[:, :, :100], value[:, :, :100], None)  # short
    assert calls == [(length, length), (100, 100)]


def test_a_full_attention_mask_is_dropped_and_any_other_is_kept():
    ones = torch.ones(2, 7, dtype=torch.long)
    assert attention.without_full_masks({"input_ids": ones, "attention_mask": ones}) == {"input_ids": ones}
    padded = ones.clone()
    padded[0, 0] = 0
    kept = {"input_ids": ones, "attention_mask": padded}
    assert attention.without_full_masks(kept) is kept
    four_d = {"attention_mask": torch.ones(2, 1, 7, 7, dtype=torch.bool)}
    assert attention.without_full_masks(four_d) is four_d


def test_a_switched_llama_matches_sdpa_with_and_without_padding_and_switches_back(llama):
    model = load_model(llama)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 200, (2, attention.CHUNK_MIN + 20), generator=gen)
    padded = torch.ones_like(ids)
    padded[0, :30] = 0  # left padding: the mask is built, as transformers builds it
    with torch.no_grad():
        expected = {name: model(input_ids=ids, attention_mask=mask).logits for name, mask in
                    (("full", torch.ones_like(ids)), ("padded", padded))}
        with attention.Switched(model):
            assert model.config._attn_implementation == attention.IMPLEMENTATION
            full = model(input_ids=ids).logits
            left = model(input_ids=ids, attention_mask=padded).logits
    assert model.config._attn_implementation == "sdpa"
    assert compare_outputs(full, expected["full"])["passed"]
    assert compare_outputs(left[1:], expected["padded"][1:])["passed"]
    assert compare_outputs(left[0, 30:], expected["padded"][0, 30:])["passed"]


def test_rotary_tables_are_computed_once_where_a_graph_runs_dynos_attention(llama):
    model = load_model(llama)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({node.target for node in gm.graph.nodes if node.op == "call_function"})
        return gm.forward

    once = torch.ops.dyno.computed_once.default
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 200, (2, attention.ROTARY_ONCE_MIN + 8), generator=gen)
    step = torch.randint(3, 200, (2, 1), generator=gen)
    try:
        with torch.no_grad():
            expected = model(input_ids=ids, use_cache=True)
            expected_step = model(input_ids=step, past_key_values=expected.past_key_values, use_cache=True).logits
            compiled = torch.compile(model, backend=backend)
            with attention.Switched(model):
                prefill = compiled(input_ids=ids, use_cache=True)
                decoded = compiled(input_ids=step, past_key_values=prefill.past_key_values, use_cache=True).logits
            assert len(graphs) == 2 and once in graphs[0]  # the prompt's tables: once
            assert once not in graphs[1]  # a one-token step's: recomputed, cheaper than the call
            assert compare_outputs(prefill.logits, expected.logits)["passed"]
            assert compare_outputs(decoded, expected_step)["passed"]
            # Outside the switch, compiled or eager, the rotary module's output is its own.
            torch._dynamo.reset()
            graphs.clear()
            torch.compile(model, backend=backend)(input_ids=ids)
            assert graphs and once not in graphs[0]
    finally:
        torch._dynamo.reset()


def test_the_policy_needs_sdpa_and_an_unknown_policy_is_refused(tmp_path):
    mamba = load_model(write_sample_model(tmp_path / "mamba", "mamba"))
    assert "not SDPA" in attention.applicable(mamba)
    with pytest.raises(ArtifactMismatch, match="unknown attention policy 'flash9'"):
        compile_kwargs({"dynamic": False, "attention": "flash9"})
    assert compile_kwargs({"dynamic": False, "attention": attention.POLICY}) == {"dynamic": False}
