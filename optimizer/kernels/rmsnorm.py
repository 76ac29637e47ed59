"""RMSNorm, y = x * rsqrt(mean(x^2, -1) + eps) * weight: a Triton kernel and its torch formulation.

The launcher exposes the tunables (block size, warps, rows per program); the torch formulation is
what torch.compile fuses on CPU and what the model patches call when no GPU is present.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import check_pow2, next_pow2, require_cuda_or_interpreter

# Tuning defaults: the Triton tutorials' norm heuristic (one row per program, the whole row in
# one block while it fits 64 KiB of fp32, warps scaling with the block). No GPU was available
# while this was written, so the search sweeps around these rather than trusting them.
MAX_SINGLE_PASS_BLOCK = 16384


@triton.jit
def _rmsnorm_kernel(
    X, W, Y, n_rows, n_cols, stride_x, stride_y, eps,
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
                inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
                w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(y_row + cols, (x * inv * w).to(Y.dtype.element_ty), mask=mask)
            else:
                # Rows wider than one block: accumulate the sum of squares, then normalize.
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    acc += x * x
                inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    w = tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
                    tl.store(y_row + start + cols, (x * inv * w).to(Y.dtype.element_ty), mask=mask)


def default_block(n_cols: int) -> int:
    return min(next_pow2(n_cols), MAX_SINGLE_PASS_BLOCK)


def default_warps(block: int) -> int:
    return min(max(block // 256, 1), 16)


def rmsnorm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
    rows_per_program: int = 1,
) -> torch.Tensor:
    """RMSNorm over the last dim of `x` (any leading dims) with a Triton kernel."""
    require_cuda_or_interpreter(x, weight)
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], n_cols), dtype=x.dtype, device=x.device)
    block = block_size or default_block(n_cols)
    check_pow2("block_size", block)
    n_rows = x2.shape[0]
    grid = (triton.cdiv(n_rows, rows_per_program),)
    _rmsnorm_kernel[grid](
        x2, weight.contiguous(), y, n_rows, n_cols, x2.stride(0), y.stride(0), eps,
        BLOCK=block, ROWS=rows_per_program, SINGLE_PASS=block >= n_cols,
        num_warps=num_warps or default_warps(block),
    )
    return y.reshape(x.shape)


def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The same math in float32 torch ops: one fused pass once torch.compile sees it."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)
