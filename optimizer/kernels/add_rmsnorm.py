"""Residual add fused with RMSNorm: (h = x + residual, rmsnorm(h) * weight) in one pass over h.

Saves a full read and write of the residual stream per decoder layer compared with add-then-norm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import check_pow2, require_cuda_or_interpreter
from optimizer.kernels.rmsnorm import default_block, default_warps


@triton.jit
def _add_rmsnorm_kernel(
    X, R, W, Y, H, n_cols, stride_x, stride_r, stride_y, stride_h, eps,
    BLOCK: tl.constexpr, SINGLE_PASS: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x_row = X + row * stride_x
    r_row = R + row * stride_r
    h_row = H + row * stride_h
    y_row = Y + row * stride_y
    if SINGLE_PASS:
        mask = cols < n_cols
        h = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) + tl.load(
            r_row + cols, mask=mask, other=0.0).to(tl.float32)
        # The residual stream keeps the input dtype, and the norm reads the rounded sum, as the
        # unfused add-then-norm does.
        h = h.to(H.dtype.element_ty)
        tl.store(h_row + cols, h, mask=mask)
        hf = h.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (hf * inv * w).to(Y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            h = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32) + tl.load(
                r_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            h = h.to(H.dtype.element_ty)
            tl.store(h_row + start + cols, h, mask=mask)
            hf = h.to(tl.float32)
            acc += hf * hf
        inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            hf = tl.load(h_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + start + cols, (hf * inv * w).to(Y.dtype.element_ty), mask=mask)


def add_rmsnorm_triton(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (normed, new_residual) where new_residual = x + residual."""
    require_cuda_or_interpreter(x, residual, weight)
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have one shape")
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols).contiguous()
    r2 = residual.reshape(-1, n_cols).contiguous()
    h = torch.empty_like(x2)
    y = torch.empty_like(x2)
    block = block_size or default_block(n_cols)
    check_pow2("block_size", block)
    _add_rmsnorm_kernel[(x2.shape[0],)](
        x2, r2, weight.contiguous(), y, h, n_cols, x2.stride(0), r2.stride(0), y.stride(0), h.stride(0), eps,
        BLOCK=block, SINGLE_PASS=block >= n_cols, num_warps=num_warps or default_warps(block),
    )
    return y.reshape(x.shape), h.reshape(x.shape)


def add_rmsnorm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + residual
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype), h
