"""Causal grouped-query attention for prefill: a flash-style Triton kernel and torch formulations.

One program per (query block, batch x query head); K/V tiles stream through an online softmax, and
query heads of one group read the same K/V head (GQA) instead of a repeated copy.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from optimizer.kernels._common import DOT_PRECISION, MIN_DOT_K, check_dot_k, check_pow2, dot_upcast, next_pow2, require_cuda_or_interpreter

# 128x64 tiles, 4 warps, 3 stages: the Triton fused-attention tutorial's forward config for
# head dim 64-128 on Hopper; the search sweeps 64/128 blocks and 4/8 warps around it.
DEFAULTS = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3}
LOG2E = 1.4426950408889634


@triton.jit
def _attention_prefill_kernel(
    Q, K, V, O, seq_len, head_dim, n_q_heads, group, qk_scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_q_heads
    h = bh % n_q_heads
    hk = h // group
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    dmask = rd < head_dim
    q = tl.load(Q + b * stride_qb + h * stride_qh + rm[:, None] * stride_qs + rd[None, :],
                mask=(rm[:, None] < seq_len) & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Causal: blocks right of the diagonal contribute nothing, so the loop stops at it.
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)
    else:
        hi = seq_len
    for start in range(0, hi, BLOCK_N):
        n = start + rn
        kt = tl.load(k_base + n[None, :] * stride_ks + rd[:, None],
                     mask=(n[None, :] < seq_len) & dmask[:, None], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale  # log2 domain: qk_scale folds in log2(e)
        valid = n[None, :] < seq_len
        if CAUSAL:
            valid = valid & (rm[:, None] >= n[None, :])
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n[:, None] * stride_vs + rd[None, :],
                    mask=(n[:, None] < seq_len) & dmask[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + rm[:, None] * stride_os + rd[None, :],
             out.to(O.dtype.element_ty), mask=(rm[:, None] < seq_len) & dmask[None, :])


def attention_prefill_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    block_m: int = DEFAULTS["block_m"],
    block_n: int = DEFAULTS["block_n"],
    num_warps: int = DEFAULTS["num_warps"],
    num_stages: int = DEFAULTS["num_stages"],
) -> torch.Tensor:
    """q[B,Hq,S,D], k/v[B,Hkv,S,D] with Hq % Hkv == 0 -> o[B,Hq,S,D], scale 1/sqrt(D)."""
    require_cuda_or_interpreter(q, k, v)
    check_pow2("block_m", block_m)
    check_dot_k("block_n", block_n)  # p @ v sums over a block of keys
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    if hq % hkv or k.shape != v.shape or k.shape[0] != b or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"need q[B,Hq,S,D], k=v[B,Hkv,S,D] with Hq % Hkv == 0; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o = torch.empty((b, hq, s, d), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(s, block_m), b * hq)
    _attention_prefill_kernel[grid](
        q, k, v, o, s, d, hq, hq // hkv, LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(MIN_DOT_K, next_pow2(d)), CAUSAL=causal, UPCAST=dot_upcast(),
        num_warps=num_warps, num_stages=num_stages,
    )
    return o



def attention_prefill_folded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA through one SDPA call with the query group folded into the batch dimension.

    K/V are broadcast to the group with expand (a view, no copy), so SDPA's CPU flash kernel
    sees plain multi-head attention and no repeat_interleave copy of K/V is made.
    """
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    qf = q.reshape(b * hkv, group, s, d)
    kf = k.reshape(b * hkv, 1, s, d).expand(b * hkv, group, s, d)
    vf = v.reshape(b * hkv, 1, s, d).expand(b * hkv, group, s, d)
    return F.scaled_dot_product_attention(qf, kf, vf, is_causal=True).reshape(b, hq, s, d)
