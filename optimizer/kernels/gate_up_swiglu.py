"""Gate/up projection fused with SwiGLU: h = silu(x @ w_gate) * (x @ w_up) in one GEMM pass.

Both products share each loaded tile of x, and the [M, F] gate and up activations never reach memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import DOT_PRECISION, check_dot_k, check_pow2, dot_upcast, require_cuda_or_interpreter

# Two fp32 accumulators per program: 64x128 output tiles (half the plain GEMM's 128x128) keep
# register pressure at one GEMM's level; a starting point for the search, not a measured optimum.
DEFAULTS = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}


@triton.jit
def _gate_up_swiglu_kernel(
    X, WG, WU, Y, M, F, K,
    stride_xm, stride_xk, stride_wk, stride_wf, stride_ym, stride_yf,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(X + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w_off = kk[:, None] * stride_wk + rn[None, :] * stride_wf
        w_mask = (kk[:, None] < K) & (rn[None, :] < F)
        wg = tl.load(WG + w_off, mask=w_mask, other=0.0)
        wu = tl.load(WU + w_off, mask=w_mask, other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
        acc_g = tl.dot(x, wg, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(x, wu, acc_u, input_precision=DOT_PRECISION)
    # Round the products to the output dtype first, as the unfused model (two Linear layers) does.
    g = acc_g.to(Y.dtype.element_ty).to(tl.float32)
    u = acc_u.to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :] * stride_yf,
             (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < F))


def gate_up_swiglu_triton(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    *,
    block_m: int = DEFAULTS["block_m"],
    block_n: int = DEFAULTS["block_n"],
    block_k: int = DEFAULTS["block_k"],
    num_warps: int = DEFAULTS["num_warps"],
    num_stages: int = DEFAULTS["num_stages"],
) -> torch.Tensor:
    """x[..., K], w_gate/w_up[K, F] (strided views such as linear.weight.T are fine) -> [..., F]."""
    require_cuda_or_interpreter(x, w_gate, w_up)
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        check_pow2(name, value)
    check_dot_k("block_k", block_k)
    k = x.shape[-1]
    if w_gate.shape != w_up.shape or w_gate.shape[0] != k or w_gate.stride() != w_up.stride():
        raise ValueError(
            f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must both be [K={k}, F] with one layout"
        )
    x2 = x.reshape(-1, k)
    m, f = x2.shape[0], w_gate.shape[1]
    y = torch.empty((m, f), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(f, block_n))
    _gate_up_swiglu_kernel[grid](
        x2, w_gate, w_up, y, m, f, k,
        x2.stride(0), x2.stride(1), w_gate.stride(0), w_gate.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=dot_upcast(),
        num_warps=num_warps, num_stages=num_stages,
    )
    return y.reshape(*x.shape[:-1], f)


def gate_up_swiglu_torch(x: torch.Tensor, w_gate_up: torch.Tensor, f: int) -> torch.Tensor:
    """One GEMM against the concatenated [K, 2F] weight, then a fused silu-multiply.

    On CPU one [M,K]x[K,2F] GEMM beats two [M,K]x[K,F] GEMMs: x is packed once, not twice.
    """
    gu = x @ w_gate_up
    g = gu[..., :f].float()
    return (g * torch.sigmoid(g) * gu[..., f:].float()).to(x.dtype)
