"""QKV projection fused with RoPE: one GEMM x @ w_qkv writes q, k (rotated) and v head by head.

Each program owns one head's D columns, computed as two half accumulators so the rotation is an
epilogue on registers instead of a second pass over q and k.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import DOT_PRECISION, check_dot_k, check_pow2, dot_upcast, next_pow2, require_cuda_or_interpreter

# 64 rows x one head (D/2 x 2 accumulators) per program, 4 warps: sized like the plain GEMM's
# 64x128 tile for D=128; a starting point for the search.
DEFAULTS = {"block_m": 64, "block_k": 64, "num_warps": 4, "num_stages": 3}


@triton.jit
def _qkv_rope_kernel(
    X, W, COS, SIN, OUT, M, K, seq_len, half, n_rot_heads,
    stride_xm, stride_xk, stride_wk, stride_wn, stride_cs,
    stride_ob, stride_oh, stride_os,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, HALF_PAD: tl.constexpr, UPCAST: tl.constexpr,
):
    head = tl.program_id(1)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HALF_PAD)
    rk = tl.arange(0, BLOCK_K)
    col1 = head * 2 * half + rd
    col2 = col1 + half
    dmask = rd < half
    acc1 = tl.zeros((BLOCK_M, HALF_PAD), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, HALF_PAD), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(X + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w_mask = (kk[:, None] < K) & dmask[None, :]
        w1 = tl.load(W + kk[:, None] * stride_wk + col1[None, :] * stride_wn, mask=w_mask, other=0.0)
        w2 = tl.load(W + kk[:, None] * stride_wk + col2[None, :] * stride_wn, mask=w_mask, other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            w1 = w1.to(tl.float32)
            w2 = w2.to(tl.float32)
        acc1 = tl.dot(x, w1, acc1, input_precision=DOT_PRECISION)
        acc2 = tl.dot(x, w2, acc2, input_precision=DOT_PRECISION)
    # The unfused model rounds the projection to its dtype before rotating; so do we.
    p1 = acc1.to(OUT.dtype.element_ty).to(tl.float32)
    p2 = acc2.to(OUT.dtype.element_ty).to(tl.float32)
    pos = rm % seq_len
    mask = (rm[:, None] < M) & dmask[None, :]
    if head < n_rot_heads:
        cs = pos[:, None] * stride_cs + rd[None, :]
        c1 = tl.load(COS + cs, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(COS + cs + half, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + cs, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + cs + half, mask=mask, other=0.0).to(tl.float32)
        o1 = p1 * c1 - p2 * s1
        o2 = p2 * c2 + p1 * s2
    else:
        o1 = p1
        o2 = p2
    batch = rm // seq_len
    o_ptr = OUT + batch[:, None] * stride_ob + head * stride_oh + pos[:, None] * stride_os + rd[None, :]
    tl.store(o_ptr, o1.to(OUT.dtype.element_ty), mask=mask)
    tl.store(o_ptr + half, o2.to(OUT.dtype.element_ty), mask=mask)


def qkv_rope_triton(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    n_q_heads: int,
    n_kv_heads: int,
    block_m: int = DEFAULTS["block_m"],
    block_k: int = DEFAULTS["block_k"],
    num_warps: int = DEFAULTS["num_warps"],
    num_stages: int = DEFAULTS["num_stages"],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x[B,S,K] @ w_qkv[K, (Hq+2Hkv)*D] -> q[B,Hq,S,D], k[B,Hkv,S,D] (both rotated), v[B,Hkv,S,D].

    The three outputs are head slices of one [B, Hq+2Hkv, S, D] buffer.
    """
    require_cuda_or_interpreter(x, w_qkv, cos, sin)
    check_pow2("block_m", block_m)
    check_dot_k("block_k", block_k)
    b, s, k = x.shape
    heads = n_q_heads + 2 * n_kv_heads
    if w_qkv.shape[0] != k or w_qkv.shape[1] % heads:
        raise ValueError(f"w_qkv {tuple(w_qkv.shape)} must be [K={k}, (Hq+2Hkv)*D] for {heads} heads")
    d = w_qkv.shape[1] // heads
    if d % 2 or tuple(cos.shape) != (s, d) or tuple(sin.shape) != (s, d):
        raise ValueError(f"need an even head dim and cos/sin of shape [{s}, {d}], got D={d}, cos {tuple(cos.shape)}")
    x2 = x.reshape(b * s, k)
    cos = cos.contiguous()
    sin = sin.contiguous()
    out = torch.empty((b, heads, s, d), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(b * s, block_m), heads)
    _qkv_rope_kernel[grid](
        x2, w_qkv, cos, sin, out, b * s, k, s, d // 2, n_q_heads + n_kv_heads,
        x2.stride(0), x2.stride(1), w_qkv.stride(0), w_qkv.stride(1), cos.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=block_m, BLOCK_K=block_k, HALF_PAD=next_pow2(d // 2), UPCAST=dot_upcast(),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out[:, :n_q_heads], out[:, n_q_heads:n_q_heads + n_kv_heads], out[:, n_q_heads + n_kv_heads:]
