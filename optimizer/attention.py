"""Dyno's attention for whole-model compiles of transformers models: static masks, chunked prefill.

Two measured losses of a compiled transformers model on CPU, both in attention:

1. **Masks built inside the graph.** Eager transformers reads the padding mask at run time and,
   when nothing is padded, calls SDPA with `is_causal=True` (or no mask for an encoder) and builds
   no mask at all. Under `torch.compile` (torch < 2.14) it cannot read values, so it builds the
   full batch x 1 x q x kv boolean mask in the graph (with the packed-sequence check) and calls
   SDPA with it: 9 ms of the compiled Llama sample's 67 ms at batch 8 x seq 512, one thread, and a
   masked SDPA. The policy here decides outside the graph instead: the artifact's call drops an
   attention mask that is all ones (what eager's own check concludes), and the mask function
   registered under `IMPLEMENTATION` returns no mask when there is no padding mask and the pattern
   is plain causal (q == kv, or one query) or plain bidirectional; every other case (a padding mask
   with zeros, sliding windows, packed sequences, custom patterns) goes to transformers' own
   `sdpa_mask` unchanged.
2. **Causal prefill computes the masked half.** ATen's CPU flash kernel splits the keys in blocks
   of 512, so at 512 tokens a causal call computes every score and masks half. Long causal prefill
   (`CHUNK_MIN` tokens and more) is computed per block of `CHUNK_ROWS` query rows against only the
   keys up to the block's end (the first block causal, later blocks with the causal slice of a
   lower-triangular mask).
3. **Rotary tables computed per element.** A rotary model computes its cos/sin tables once per
   forward (batch x tokens x head_dim) and every layer's query and key rotation reads them. Inductor
   inlines that cheap-looking pointwise producer into each consumer: every query and key element
   (and, with the blocks above, every block's slice of them) recomputes its cos and sin, scalar
   (the table's index is a modulo): 0.9 ms of the compiled Llama sample's forward at batch 2 x
   seq 512, one thread (profiled). Under the policy, the output of each rotary module (a pair of
   equal-shaped CPU tensors of at least ROTARY_ONCE_MIN tokens) passes through `computed_once`, an
   opaque copy that Inductor cannot inline, so the tables are computed once and read. Paired in
   process against eager (C++ wrapper, fixed modules, one thread, 2026-12-06): 2 x 512 from 1.23x
   to 1.41x (5.7 to 5.1 ms), 8 x 512 from 1.54x to 1.60x, 2 x 64 from 2.03x to 2.21x.

Every strategy that uses this is checked against the unmodified model (prefill and a decode step)
before it is kept; the reference point on the report stays torch.compile with default settings.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers import masking_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# The attention implementation name models are switched to, and the artifact's policy name.
IMPLEMENTATION = "dyno_sdpa"
POLICY = "dyno-sdpa"
# Causal prefill of at least CHUNK_MIN tokens runs in blocks of CHUNK_ROWS query rows: the Llama
# sample at batch 8 x seq 512 (4 heads of 16), one thread, compiled with static masks, 51.8 ms in
# blocks of 64 against 54.8 ms unchunked (eager 67 ms; two runs on a noisy box); in one process,
# blocks of 32, 64 and 128 rows ran 59.2, 55.1 and 59.8 ms (eager 77-81 ms at the time).
CHUNK_ROWS = 64
CHUNK_MIN = 256
# Rotary tables of at least this many tokens are computed once (`computed_once`): a decode step's
# one-token table costs less to recompute than the opaque call's own overhead.
ROTARY_ONCE_MIN = 16
# Keyword arguments that change what attention computes beyond q, k, v and causality: with any of
# them set, the call goes to transformers' SDPA as it is.
_UNCHUNKED_WHEN = ("position_bias", "softcap", "sinks", "s_aux", "sliding_window")


def _static_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                 mask_function: Any = masking_utils.causal_mask_function, attention_mask: torch.Tensor | None = None,
                 local_size: int | None = None, allow_is_causal_skip: bool = True,
                 allow_is_bidirectional_skip: bool = False, **kwargs: Any) -> torch.Tensor | None:
    """transformers' `sdpa_mask`, except that the skip needs no value read: with no padding mask,
    no local window and a plain causal (q == kv or one query) or bidirectional pattern, no mask."""
    plain = attention_mask is None and local_size is None and not isinstance(q_offset, torch.Tensor)
    if plain and allow_is_causal_skip and mask_function is masking_utils.causal_mask_function \
            and (q_length == 1 or kv_length == q_length):
        return None
    if plain and allow_is_bidirectional_skip and mask_function is masking_utils.bidirectional_mask_function:
        return None
    return masking_utils.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                                   attention_mask, local_size, allow_is_causal_skip=allow_is_causal_skip,
                                   allow_is_bidirectional_skip=allow_is_bidirectional_skip, **kwargs)


def _chunked_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention; long causal prefill with no mask runs in query blocks, each
    against the keys up to its end (the same scores and softmax, without the masked half)."""
    q_len = query.shape[2]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    if (attention_mask is not None or not causal or q_len < CHUNK_MIN or key.shape[2] != q_len
            or kwargs.get("dropout", 0.0) or any(kwargs.get(k) is not None for k in _UNCHUNKED_WHEN)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    lower = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).tril()
    blocks = []
    for start in range(0, q_len, CHUNK_ROWS):
        end = min(start + CHUNK_ROWS, q_len)
        mask = None if start == 0 else lower[start:end, :end]  # the first block: causal, q == kv
        out, _ = sdpa_attention_forward(module, query[:, :, start:end], key[:, :, :end], value[:, :, :end],
                                        mask, **kwargs)
        blocks.append(out)  # batch x rows x heads x head_dim
    return torch.cat(blocks, dim=1), None


@torch.library.custom_op("dyno::computed_once", mutates_args=())
def computed_once(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair unchanged (copied): opaque to Inductor, so a compiled graph computes it once."""
    return cos.clone(), sin.clone()


@computed_once.register_fake
def _(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(cos), torch.empty_like(sin)


def _rotary_tables_once(module: torch.nn.Module, args: Any, output: Any) -> Any:
    """Forward hook of a rotary module: while a graph that runs Dyno's attention is traced, its
    (cos, sin) pair goes through `computed_once`; otherwise (eager, other policies) nothing."""
    if not torch.compiler.is_compiling():
        return None
    if getattr(getattr(module, "config", None), "_attn_implementation", None) != IMPLEMENTATION:
        return None
    if (isinstance(output, tuple) and len(output) == 2 and all(isinstance(t, torch.Tensor) for t in output)
            and output[0].shape == output[1].shape and output[0].device.type == "cpu" and output[0].dim() >= 2
            and isinstance(output[0].shape[-2], int) and output[0].shape[-2] >= ROTARY_ONCE_MIN):
        return computed_once(*output)
    return None


def _hook_rotary_modules(model: torch.nn.Module) -> int:
    """Add `_rotary_tables_once` to every rotary module of `model` once; how many have it."""
    count = 0
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            if not getattr(module, "_dyno_rotary_hooked", False):
                module.register_forward_hook(_rotary_tables_once)
                module._dyno_rotary_hooked = True
            count += 1
    return count


def register() -> None:
    """Register the implementation with transformers (idempotent)."""
    AttentionInterface.register(IMPLEMENTATION, _chunked_sdpa)
    masking_utils.AttentionMaskInterface.register(IMPLEMENTATION, _static_mask)


def _configs(model: torch.nn.Module) -> list[Any]:
    """Every distinct config the model's modules read their attention implementation from."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def applicable(model: torch.nn.Module) -> str | None:
    """None when `model` can run Dyno's attention, else why not."""
    current = getattr(model.config, "_attn_implementation", None)
    if current != "sdpa":
        return f"the model's attention runs {current!r}, not SDPA"
    if not model._can_set_attn_implementation():
        return "the model does not dispatch attention through transformers' attention interface"
    return None


class Switched:
    """Context manager: the model's SDPA attention runs as IMPLEMENTATION inside, and as before
    after, so the uncompiled model (a reference, a fallback) is never changed. The switch is on
    the model's shared configs: another thread calling the same model meanwhile would see it."""

    def __init__(self, model: torch.nn.Module):
        register()
        _hook_rotary_modules(model)
        self.configs = [c for c in _configs(model) if c._attn_implementation_internal == "sdpa"]

    def __enter__(self) -> Switched:
        for config in self.configs:
            config._attn_implementation_internal = IMPLEMENTATION
        return self

    def __exit__(self, *exc: Any) -> None:
        for config in self.configs:
            config._attn_implementation_internal = "sdpa"


def without_full_masks(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keyword arguments without an attention mask that masks nothing (2-D, all ones):
    read outside the graph, as eager transformers reads it before choosing `is_causal`."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool(mask.all()):
        kwargs = {k: v for k, v in kwargs.items() if k != "attention_mask"}
    return kwargs


__all__ = ["CHUNK_MIN", "CHUNK_ROWS", "IMPLEMENTATION", "POLICY", "Switched", "applicable", "computed_once", "register",
           "without_full_masks"]
