"""Model loading and the workload inventory, on the tiny sample models (2 layers, hidden 64)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from runners.modelload import UnsupportedModel, load_model, resolve_model_class
from runners.inventory import SCHEMA, Family, take_inventory
from runners.samples import write_sample_model

BATCH, SEQ = 2, 8
TOKENS = BATCH * SEQ
LAYERS, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2, 64, 128, 4, 2, 16, 256


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("profile-samples")
    return {family: write_sample_model(root / family, family) for family in ("llama", "mixtral", "gpt2", "bert", "mamba")}


@pytest.fixture(scope="module")
def inventories(samples: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {family: take_inventory(path, batch=BATCH, seq=SEQ, repeats=2) for family, path in samples.items()}


def entries(inventory: dict[str, Any], family: str) -> list[dict[str, Any]]:
    return [w for w in inventory["workloads"] if w["family"] == family]


def total_count(inventory: dict[str, Any], family: str) -> int:
    return sum(w["count"] for w in entries(inventory, family))


def test_it_writes_the_documented_schema(inventories: dict[str, dict[str, Any]]) -> None:
    result = inventories["llama"]
    assert result["schema"] == SCHEMA == "dyno.inventory/1"
    assert result["model"] == {"family": "llama", "architecture": "LlamaForCausalLM", "parameter_count": 106816}
    assert (result["batch"], result["seq"], result["device"], result["dtype"]) == (BATCH, SEQ, "cpu", "float32")
    assert result["torch"] == torch.__version__
    assert json.loads(json.dumps(result)) == result
    suite_names = {str(f) for f in Family}
    for inventory in inventories.values():
        assert {w["family"] for w in inventory["workloads"]} <= suite_names


def test_it_measures_a_positive_eager_latency(inventories: dict[str, dict[str, Any]]) -> None:
    latency = inventories["llama"]["eager_latency_s"]
    assert len(latency["samples"]) == 2 and all(s > 0 for s in latency["samples"])
    assert min(latency["samples"]) <= latency["median"] <= max(latency["samples"])


def test_it_inventories_the_gemms_of_a_llama(inventories: dict[str, dict[str, Any]]) -> None:
    result = inventories["llama"]
    shapes = {(w["shape"]["M"], w["shape"]["K"], w["shape"]["N"]): w["count"] for w in entries(result, "gemm")}
    q_width, kv_width = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    assert shapes == {
        (TOKENS, HIDDEN, q_width): 2 * LAYERS,  # q_proj and o_proj (square here)
        (TOKENS, HIDDEN, kv_width): 2 * LAYERS,  # k_proj, v_proj
        (TOKENS, HIDDEN, INTERMEDIATE): 2 * LAYERS,  # gate_proj, up_proj
        (TOKENS, INTERMEDIATE, HIDDEN): LAYERS,  # down_proj
        (TOKENS, HIDDEN, VOCAB): 1,  # lm_head
    }
    assert total_count(result, "gemm") == LAYERS * 7 + 1
    assert all(w["dtype"] == "float32" and w["eager_time_s"] > 0 for w in entries(result, "gemm"))


def test_it_inventories_norms_attention_rope_and_swiglu_of_a_llama(inventories: dict[str, dict[str, Any]]) -> None:
    result = inventories["llama"]
    [norm] = entries(result, "rmsnorm")
    assert norm["shape"] == {"R": TOKENS, "H": HIDDEN} and norm["count"] == 2 * LAYERS + 1
    [attention] = entries(result, "attention_prefill")
    assert attention["shape"] == {"B": BATCH, "Hq": HEADS, "Hkv": KV_HEADS, "S": SEQ, "D": HEAD_DIM}
    assert attention["count"] == LAYERS and attention["attrs"]["causal"] is True
    [rope] = entries(result, "rope")
    assert rope["shape"] == {"B": BATCH, "H": HEADS, "Hkv": KV_HEADS, "S": SEQ, "D": HEAD_DIM} and rope["count"] == LAYERS
    [swiglu] = entries(result, "swiglu")
    assert swiglu["shape"] == {"R": TOKENS, "F": INTERMEDIATE} and swiglu["count"] == LAYERS
    assert not entries(result, "layernorm") and not entries(result, "moe")


def test_it_reports_what_it_could_not_classify(inventories: dict[str, dict[str, Any]]) -> None:
    result = inventories["llama"]
    ops = {row["op"] for row in result["unclassified"]}
    assert "aten.embedding" in ops  # the token lookup is real work but no suite workload
    assert result["instrumented_time_s"]["classified"] > 0


def test_it_finds_the_experts_of_a_mixtral(inventories: dict[str, dict[str, Any]]) -> None:
    result = inventories["mixtral"]
    [moe] = entries(result, "moe")
    assert moe["shape"] == {"T": TOKENS, "H": HIDDEN, "F": INTERMEDIATE, "E": 4, "topk": 2}
    assert moe["count"] == LAYERS and moe["eager_time_s"] > 0
    # Router and expert products belong to the MoE entry; only attention projections and lm_head remain.
    assert total_count(result, "gemm") == LAYERS * 4 + 1
    assert not entries(result, "swiglu")


def test_it_finds_layernorm_and_causal_attention_in_gpt2(inventories: dict[str, dict[str, Any]]) -> None:
    result = inventories["gpt2"]
    [norm] = entries(result, "layernorm")
    assert norm["shape"] == {"R": TOKENS, "H": HIDDEN} and norm["count"] == 2 * LAYERS + 1
    [attention] = entries(result, "attention_prefill")
    assert attention["attrs"]["causal"] is True and attention["shape"]["Hkv"] == HEADS
    # GPT-2's Conv1D stores its weight as [in, out]; the GEMM must still read (M, K, N) right.
    assert {"M": TOKENS, "K": HIDDEN, "N": 3 * HIDDEN} in [w["shape"] for w in entries(result, "gemm")]
    assert not entries(result, "rmsnorm") and not entries(result, "rope")


def test_it_sees_that_bert_attends_both_ways(inventories: dict[str, dict[str, Any]]) -> None:
    [attention] = entries(inventories["bert"], "attention_prefill")
    assert attention["attrs"]["causal"] is False and attention["count"] == LAYERS


def test_it_finds_the_selective_scan_of_mamba(inventories: dict[str, dict[str, Any]]) -> None:
    result = inventories["mamba"]
    [scan] = entries(result, "ssm_scan")
    assert scan["shape"] == {"B": BATCH, "D": 2 * HIDDEN, "L": SEQ, "N": 16} and scan["count"] == LAYERS
    assert scan["eager_time_s"] > 0
    assert not entries(result, "attention_prefill")


def test_it_reports_progress_up_to_done(samples: dict[str, Path]) -> None:
    seen: list[tuple[float, str]] = []
    take_inventory(samples["llama"], batch=1, seq=4, repeats=1, progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert all(message for _, message in seen)


def test_it_restores_the_modeling_functions_it_wraps(samples: dict[str, Path]) -> None:
    from transformers.models.llama import modeling_llama

    before = (modeling_llama.apply_rotary_pos_emb, modeling_llama.eager_attention_forward)
    take_inventory(samples["llama"], batch=1, seq=4, repeats=1)
    assert (modeling_llama.apply_rotary_pos_emb, modeling_llama.eager_attention_forward) == before


def test_it_profiles_eager_attention_too(samples: dict[str, Path]) -> None:
    from runners.inventory import instrumented_inventory, make_inputs

    model, config = load_model(samples["llama"])
    model.set_attn_implementation("eager")
    inputs = make_inputs(model, config, batch=BATCH, seq=SEQ, device="cpu")
    workloads, _ = instrumented_inventory(model, config, inputs, "cpu", passes=1)
    [attention] = [w for w in workloads if w["family"] == "attention_prefill"]
    assert attention["attrs"]["causal"] is True and attention["shape"]["Hkv"] == KV_HEADS
    # The eager path's matmuls and softmax are the attention's, not free-standing GEMMs.
    assert sum(w["count"] for w in workloads if w["family"] == "gemm") == LAYERS * 7 + 1
    assert not [w for w in workloads if w["family"] == "softmax"]


def test_it_refuses_a_sequence_longer_than_the_model_allows(samples: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="max_position_embeddings"):
        take_inventory(samples["bert"], batch=1, seq=513, repeats=1)


# -- loading ------------------------------------------------------------------------------------


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(12).reshape(2, 6)
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_it_loads_the_uploaded_weights(tmp_path: Path) -> None:
    first = write_sample_model(tmp_path / "seed0", "llama", seed=0)
    second = write_sample_model(tmp_path / "seed1", "llama", seed=1)
    again = write_sample_model(tmp_path / "seed0-again", "llama", seed=0)
    model_a, config = load_model(first)
    assert not model_a.training and config.model_type == "llama"
    assert not torch.allclose(logits(model_a), logits(load_model(second)[0]))
    assert torch.equal(logits(model_a), logits(load_model(again)[0]))


def test_it_gives_an_architecture_card_seeded_random_weights(tmp_path: Path) -> None:
    card = write_sample_model(tmp_path / "card", "llama", weights=False)
    a, b, c = load_model(card, seed=0)[0], load_model(card, seed=0)[0], load_model(card, seed=1)[0]
    assert torch.equal(logits(a), logits(b))
    assert not torch.allclose(logits(a), logits(c))


def test_it_loads_in_the_requested_dtype(samples: dict[str, Path]) -> None:
    model, _ = load_model(samples["llama"], dtype="bfloat16")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_it_refuses_classes_outside_transformers(samples: dict[str, Path]) -> None:
    from runners.modelload import read_config

    config = read_config(samples["llama"])
    config.architectures = ["EvilForCausalLM"]
    with pytest.raises(UnsupportedModel) as caught:
        resolve_model_class(config)
    assert caught.value.code == "unknown_architecture"


def test_a_card_too_large_for_the_profile_memory_fails_cleanly_and_the_limit_comes_back(tmp_path: Path) -> None:
    """An architecture card built with random weights on a runner is held to a memory window like
    a sandboxed worker: it fails with a message, and the process's own limit is restored."""
    import resource

    from runners.inventory import InventoryMemoryExceeded

    card = write_sample_model(tmp_path / "card", "llama", weights=False)
    config = json.loads((card / "config.json").read_text())
    config.update(hidden_size=4096, intermediate_size=11008, num_hidden_layers=8, vocab_size=32000)
    (card / "config.json").write_text(json.dumps(config))
    before = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(InventoryMemoryExceeded, match="0.2 GiB an inventory may use"):
        take_inventory(card, batch=1, seq=8, memory_bytes=200 << 20)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    tiny = write_sample_model(tmp_path / "tiny", "llama", weights=False)
    assert take_inventory(tiny, batch=1, seq=8, repeats=1, memory_bytes=2 << 30)["workloads"]  # fits its window
    assert resource.getrlimit(resource.RLIMIT_AS) == before
