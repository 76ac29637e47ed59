"""Rotary position embedding on q and k (rotate-half convention, cos/sin given per position).

out = x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import check_pow2, next_pow2, require_cuda_or_interpreter

# Rows (b, h, s) per program: 16 rows of D/2=64 halves keeps a 4-warp program on two 1 KiB
# vectors per half (Triton tutorial sizing); swept by the search.
DEFAULT_BLOCK_ROWS = 16


@triton.jit
def _rope_kernel(
    X, COS, SIN, Y, n_rows, seq_len, half, stride_cs,
    BLOCK_ROWS: tl.constexpr, HALF_PAD: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, HALF_PAD)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < half)
    pos = rows % seq_len
    base = rows[:, None].to(tl.int64) * (2 * half) + cols[None, :]
    x1 = tl.load(X + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + base + half, mask=mask, other=0.0).to(tl.float32)
    cs = pos[:, None] * stride_cs + cols[None, :]
    c1 = tl.load(COS + cs, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(COS + cs + half, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + cs, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + cs + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + base, (x1 * c1 - x2 * s1).to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + base + half, (x2 * c2 + x1 * s2).to(Y.dtype.element_ty), mask=mask)


def _rope_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block_rows: int, num_warps: int) -> torch.Tensor:
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rope needs an even head dim, got D={d}")
    seq_len = x.shape[-2]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n_rows = xc.numel() // d
    half = d // 2
    _rope_kernel[(triton.cdiv(n_rows, block_rows),)](
        xc, cos, sin, y, n_rows, seq_len, half, cos.stride(0),
        BLOCK_ROWS=block_rows, HALF_PAD=next_pow2(half), num_warps=num_warps,
    )
    return y


def rope_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q[B,H,S,D], k[B,Hkv,S,D], cos/sin[S,D] -> rotated (q, k). Two launches of one kernel."""
    require_cuda_or_interpreter(q, k, cos, sin)
    check_pow2("block_rows", block_rows)
    cos = cos.contiguous()
    sin = sin.contiguous()
    return _rope_one(q, cos, sin, block_rows, num_warps), _rope_one(k, cos, sin, block_rows, num_warps)


def rope_torch(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-split formulation without the cat of rotate_half: fuses to one loop per output."""
    half = q.shape[-1] // 2
    c1, c2 = cos[..., :half].float(), cos[..., half:].float()
    s1, s2 = sin[..., :half].float(), sin[..., half:].float()

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def rope_torch_native(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-split formulation in the input dtype (no explicit upcast): for torch.compile, which
    upcasts low-precision loads itself, and fewer conversions when run eagerly."""
    half = q.shape[-1] // 2
    c1, c2, s1, s2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)

    return rotate(q), rotate(k)
