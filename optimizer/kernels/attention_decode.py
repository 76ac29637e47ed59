"""Single-token attention over a long KV cache (decode), split-KV (flash-decoding) in Triton.

Phase 1: one program per (batch, KV head, split) scores all the group's query heads against its
slice of the cache, so each K/V row is read once per group; phase 2 merges the splits' partial
softmaxes. Torch formulations for CPU live beside it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from optimizer.kernels._common import DOT_PRECISION, MIN_DOT_K, check_dot_k, check_pow2, dot_upcast, next_pow2, require_cuda_or_interpreter
from optimizer.kernels.attention_prefill import LOG2E

# 64-row KV tiles, 4 warps, and enough splits that B*Hkv*splits fills the GPU (~2 programs per
# SM): the flash-decoding heuristic. Not measured here (no GPU while writing); the search sweeps it.
DEFAULTS = {"block_n": 64, "num_warps": 4, "num_stages": 2}
# tl.dot needs at least 16 rows on NVIDIA GPUs; a group of fewer query heads is padded.
MIN_DOT_ROWS = 16


@triton.jit
def _decode_split_kernel(
    Q, K, V, M_OUT, L_OUT, ACC_OUT, cache_len, head_dim, n_kv_heads, group, split_len, qk_scale,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
):
    bk = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = bk // n_kv_heads
    hk = bk % n_kv_heads
    rg = tl.arange(0, BLOCK_G)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    gmask = rg < group
    dmask = rd < head_dim
    heads = hk * group + rg
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + rd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    lo = split * split_len
    hi = tl.minimum(lo + split_len, cache_len)
    m_i = tl.full([BLOCK_G], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + rn
        nmask = n < hi
        kt = tl.load(k_base + n[None, :] * stride_ks + rd[:, None], mask=nmask[None, :] & dmask[:, None], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.where(nmask[None, :], tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n[:, None] * stride_vs + rd[None, :], mask=nmask[:, None] & dmask[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    # Partials indexed [b, query head, split]; an empty split leaves m=-inf, l=0 and is skipped
    # by the merge.
    row = (b * n_kv_heads * group + heads) * n_splits + split
    tl.store(M_OUT + row, m_i, mask=gmask)
    tl.store(L_OUT + row, l_i, mask=gmask)
    tl.store(ACC_OUT + row[:, None] * head_dim + rd[None, :], acc, mask=gmask[:, None] & dmask[None, :])


@triton.jit
def _decode_merge_kernel(
    M_IN, L_IN, ACC_IN, O, n_splits, head_dim,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(0)
    rs = tl.arange(0, BLOCK_S)
    rd = tl.arange(0, BLOCK_D)
    smask = rs < n_splits
    dmask = rd < head_dim
    m = tl.load(M_IN + bh * n_splits + rs, mask=smask, other=-float("inf"))
    l = tl.load(L_IN + bh * n_splits + rs, mask=smask, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.where(m == -float("inf"), 0.0, tl.math.exp2(m - m_max))
    acc = tl.load(ACC_IN + (bh * n_splits + rs)[:, None] * head_dim + rd[None, :],
                  mask=smask[:, None] & dmask[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(O + bh * head_dim + rd, out.to(O.dtype.element_ty), mask=dmask)


def default_splits(batch: int, kv_heads: int, cache_len: int, block_n: int, sm_count: int = 132) -> int:
    """Enough splits for ~2 programs per SM, never a split shorter than one KV tile."""
    wanted = max(1, (2 * sm_count) // max(1, batch * kv_heads))
    return max(1, min(wanted, triton.cdiv(cache_len, block_n)))


def attention_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    num_splits: int | None = None,
    block_n: int = DEFAULTS["block_n"],
    num_warps: int = DEFAULTS["num_warps"],
    num_stages: int = DEFAULTS["num_stages"],
) -> torch.Tensor:
    """q[B,Hq,1,D], k_cache/v_cache[B,Hkv,L,D] -> o[B,Hq,1,D], scale 1/sqrt(D), no mask."""
    require_cuda_or_interpreter(q, k_cache, v_cache)
    check_dot_k("block_n", block_n)  # p @ v sums over a block of keys
    b, hq, one, d = q.shape
    _, hkv, cache_len, _ = k_cache.shape
    if one != 1 or hq % hkv or k_cache.shape != v_cache.shape or k_cache.shape[0] != b or k_cache.shape[3] != d:
        raise ValueError(f"need q[B,Hq,1,D], k_cache=v_cache[B,Hkv,L,D] with Hq % Hkv == 0; got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    splits = num_splits or default_splits(b, hkv, cache_len, block_n)
    # Every split gets whole KV tiles, so only the last split's last tile is ragged.
    split_len = triton.cdiv(triton.cdiv(cache_len, splits), block_n) * block_n
    splits = triton.cdiv(cache_len, split_len)
    group = hq // hkv
    k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (k_cache, v_cache))
    qc = q.contiguous()
    m_part = torch.empty((b * hq * splits,), dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty((b * hq * splits, d), dtype=torch.float32, device=q.device)
    block_d = max(MIN_DOT_K, next_pow2(d))  # q @ k^T sums over the head dimension
    _decode_split_kernel[(b * hkv, splits)](
        qc, k_cache, v_cache, m_part, l_part, acc_part, cache_len, d, hkv, group, split_len,
        LOG2E / math.sqrt(d),
        qc.stride(0), qc.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_G=max(MIN_DOT_ROWS, next_pow2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        UPCAST=dot_upcast(), num_warps=num_warps, num_stages=num_stages,
    )
    o = torch.empty((b, hq, 1, d), dtype=q.dtype, device=q.device)
    _decode_merge_kernel[(b * hq,)](
        m_part, l_part, acc_part, o, splits, d, BLOCK_S=next_pow2(splits), BLOCK_D=block_d, num_warps=1,
    )
    return o


def attention_decode_folded(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """GQA decode as SDPA with the group's query heads stacked as G query rows per KV head.

    One query token has no causal structure, so q[B,Hq,1,D] viewed as [B,Hkv,G,D] attends to
    k/v[B,Hkv,L,D] exactly as the grouped heads would; each cache row is read once per group
    instead of once per query head.
    """
    b, hq, _, d = q.shape
    hkv = k_cache.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, hq // hkv, d), k_cache, v_cache)
    return out.reshape(b, hq, 1, d)


def attention_decode_matmul(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """The folded decode as two batched GEMMs and a float32 softmax: a torch.compile target."""
    b, hq, _, d = q.shape
    hkv = k_cache.shape[1]
    qg = q.reshape(b, hkv, hq // hkv, d)
    scores = torch.matmul(qg, k_cache.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))
    p = torch.softmax(scores, dim=-1).to(v_cache.dtype)
    return torch.matmul(p, v_cache).reshape(b, hq, 1, d)
