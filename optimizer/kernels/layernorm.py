"""LayerNorm over the last dim, y = (x - mean) / sqrt(var + eps) * weight + bias: Triton and torch.

Same tunables as rmsnorm (block, warps, rows per program); statistics are taken in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import check_pow2, require_cuda_or_interpreter
from optimizer.kernels.rmsnorm import default_block, default_warps


@triton.jit
def _layernorm_kernel(
    X, W, B, Y, n_rows, n_cols, stride_x, stride_y, eps,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, SINGLE_PASS: tl.constexpr,
):
    row0 = tl.program_id(0) * ROWS
    cols = tl.arange(0, BLOCK)
    for r in range(ROWS):
        row = row0 + r
        if row < n_rows:
            x_row = X + row * stride_x
            y_row = Y + row * stride_y
            if SINGLE_PASS:
                mask = cols < n_cols
                x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
                mean = tl.sum(x, axis=0) / n_cols
                xc = tl.where(mask, x - mean, 0.0)
                inv = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
                w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(y_row + cols, (xc * inv * w + b).to(Y.dtype.element_ty), mask=mask)
            else:
                # Two statistics passes (mean, then centered variance) rather than E[x^2]-E[x]^2,
                # which cancels catastrophically for rows with a large mean.
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    acc += tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                mean = tl.sum(acc, axis=0) / n_cols
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    xc = tl.where(mask, x - mean, 0.0)
                    acc += xc * xc
                inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    w = tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
                    b = tl.load(B + start + cols, mask=mask, other=0.0).to(tl.float32)
                    tl.store(y_row + start + cols, ((x - mean) * inv * w + b).to(Y.dtype.element_ty), mask=mask)


def layernorm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-6,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
    rows_per_program: int = 1,
) -> torch.Tensor:
    require_cuda_or_interpreter(x, weight, bias)
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], n_cols), dtype=x.dtype, device=x.device)
    block = block_size or default_block(n_cols)
    check_pow2("block_size", block)
    n_rows = x2.shape[0]
    _layernorm_kernel[(triton.cdiv(n_rows, rows_per_program),)](
        x2, weight.contiguous(), bias.contiguous(), y, n_rows, n_cols, x2.stride(0), y.stride(0), eps,
        BLOCK=block, ROWS=rows_per_program, SINGLE_PASS=block >= n_cols,
        num_warps=num_warps or default_warps(block),
    )
    return y.reshape(x.shape)


def layernorm_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Float32 formulation for torch.compile: mean and centered variance in one fused kernel."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    xc = xf - mean
    y = xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps)
    return (y * weight.float() + bias.float()).to(x.dtype)
