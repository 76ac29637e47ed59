"""Softmax over the last dim: a Triton kernel (single block, or online max/sum for wide rows) and torch.

Tunables: block size, warps, rows per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import check_pow2, require_cuda_or_interpreter
from optimizer.kernels.rmsnorm import default_block, default_warps


@triton.jit
def _softmax_kernel(
    X, Y, n_rows, n_cols, stride_x, stride_y,
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
                x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
                e = tl.exp(x - tl.max(x, axis=0))
                tl.store(y_row + cols, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty), mask=mask)
            else:
                # Online softmax: one pass for the running max and rescaled sum, one to write.
                m = tl.full([BLOCK], -float("inf"), tl.float32)
                s = tl.zeros([BLOCK], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
                    m_new = tl.maximum(m, x)
                    # Lanes that have seen only padding keep m = -inf; guard the 0 * inf there.
                    scale = tl.where(m_new == -float("inf"), 0.0, tl.exp(m - m_new))
                    s = s * scale + tl.where(x == -float("inf"), 0.0, tl.exp(x - m_new))
                    m = m_new
                row_max = tl.max(m, axis=0)
                total = tl.sum(tl.where(m == -float("inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
                for start in range(0, n_cols, BLOCK):
                    mask = start + cols < n_cols
                    x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
                    tl.store(y_row + start + cols, (tl.exp(x - row_max) / total).to(Y.dtype.element_ty), mask=mask)


def softmax_triton(
    x: torch.Tensor,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
    rows_per_program: int = 1,
) -> torch.Tensor:
    require_cuda_or_interpreter(x)
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], n_cols), dtype=x.dtype, device=x.device)
    block = block_size or default_block(n_cols)
    check_pow2("block_size", block)
    n_rows = x2.shape[0]
    _softmax_kernel[(triton.cdiv(n_rows, rows_per_program),)](
        x2, y, n_rows, n_cols, x2.stride(0), y.stride(0),
        BLOCK=block, ROWS=rows_per_program, SINGLE_PASS=block >= n_cols,
        num_warps=num_warps or default_warps(block),
    )
    return y.reshape(x.shape)


def softmax_torch(x: torch.Tensor) -> torch.Tensor:
    """Float32 formulation for torch.compile (max, exp-sum and normalize fused)."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)
