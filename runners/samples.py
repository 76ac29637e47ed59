"""Tiny but real Hugging Face model folders, one per supported family, for tests, demos and docs.

`write_sample_model` builds the model with `transformers` itself and saves it with `save_pretrained`
(safetensors), so what it writes is exactly what a customer's upload of that family looks like.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

# Building a sample never needs the network; say so before transformers reads its environment.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

# Sizes are picked so that a forward pass at batch 2 x seq 16 takes milliseconds on one CPU core,
# while every structural feature the profiler looks for is still there: grouped-query attention
# (4 query heads, 2 KV heads), gate/up MLPs, 4 experts with top-2 routing, a 16-wide SSM state.
_COMMON_DECODER: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

SAMPLE_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", dict(_COMMON_DECODER)),
    "mistral": ("MistralForCausalLM", dict(_COMMON_DECODER)),
    "qwen2": ("Qwen2ForCausalLM", dict(_COMMON_DECODER)),
    "mixtral": (
        "MixtralForCausalLM",
        {**_COMMON_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "gpt2": (
        "GPT2LMHeadModel",
        {
            "vocab_size": 256,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 512,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "bert": (
        "BertForMaskedLM",
        {
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 512,
            "pad_token_id": 0,
        },
    ),
    # Encoder-decoder: the encoder reads the prompt, the decoder starts from its start token.
    "t5": (
        "T5ForConditionalGeneration",
        {
            "vocab_size": 256,
            "d_model": 64,
            "d_kv": 16,
            "d_ff": 128,
            "num_layers": 2,
            "num_decoder_layers": 2,
            "num_heads": 4,
            "feed_forward_proj": "gated-gelu",
            "decoder_start_token_id": 0,
            "pad_token_id": 0,
            "eos_token_id": 1,
        },
    ),
    "mamba": (
        "MambaForCausalLM",
        {
            "vocab_size": 256,
            "hidden_size": 64,
            "state_size": 16,
            "num_hidden_layers": 2,
            "expand": 2,
            "conv_kernel": 4,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
    ),
}


def sample_config(family: str) -> transformers.PretrainedConfig:
    """The tiny config of `family`, with `architectures` filled in as `save_pretrained` would."""
    if family not in SAMPLE_FAMILIES:
        known = ", ".join(sorted(SAMPLE_FAMILIES))
        raise ValueError(f"no sample model for family {family!r}; pick one of: {known}")
    architecture, kwargs = SAMPLE_FAMILIES[family]
    config = transformers.AutoConfig.for_model(family, **kwargs)
    config.architectures = [architecture]
    config.dtype = torch.float32
    return config


def write_sample_model(dest: Path, family: str = "llama", *, weights: bool = True, seed: int = 0) -> Path:
    """Write a tiny `family` model folder into `dest` and return `dest`.

    With `weights` the folder holds config.json and model.safetensors (initialised from `seed`, so two
    seeds give two different models and one seed always the same); without, config.json alone: an
    architecture card.
    """
    dest = Path(dest)
    config = sample_config(family)
    dest.mkdir(parents=True, exist_ok=True)
    if not weights:
        config.save_pretrained(dest)
        return dest
    model_class = getattr(transformers, SAMPLE_FAMILIES[family][0])
    # fork_rng keeps the caller's global RNG stream untouched by our seeding.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    # transformers >= 4.35 saves safetensors by default and 5.x only knows safetensors, so no flag
    # is passed (5.x would silently ignore `safe_serialization`).
    model.save_pretrained(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runners.samples",
        description="Write a tiny Hugging Face model folder (or architecture card) for demos and tests.",
    )
    parser.add_argument("dest", type=Path, help="folder to write (created if missing)")
    parser.add_argument("--family", default="llama", choices=sorted(SAMPLE_FAMILIES))
    parser.add_argument("--card", action="store_true", help="write config.json only (no weights)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    args = parser.parse_args(argv)
    path = write_sample_model(args.dest, args.family, weights=not args.card, seed=args.seed)
    names = ", ".join(sorted(p.name for p in path.iterdir()))
    print(f"wrote {args.family} {'card' if args.card else 'model'} to {path}: {names}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
