"""SwiGLU activation, silu(gate) * up, elementwise: Triton kernel and torch formulation.

Tunables: block size and warps. Pure bandwidth: one read of each input, one write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import check_pow2, require_cuda_or_interpreter

# 1024 elements x 4 warps is the Triton vector-add tutorial's choice for bandwidth-bound kernels.
DEFAULT_BLOCK = 1024


@triton.jit
def _swiglu_kernel(G, U, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=mask)


def swiglu_triton(
    gate: torch.Tensor, up: torch.Tensor, *, block_size: int = DEFAULT_BLOCK, num_warps: int = 4
) -> torch.Tensor:
    require_cuda_or_interpreter(gate, up)
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    check_pow2("block_size", block_size)
    g = gate.contiguous()
    u = up.contiguous()
    y = torch.empty_like(g)
    n = g.numel()
    _swiglu_kernel[(triton.cdiv(n, block_size),)](g, u, y, n, BLOCK=block_size, num_warps=num_warps)
    return y


def swiglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Float32 formulation for torch.compile (one fused elementwise loop)."""
    g = gate.float()
    return (g * torch.sigmoid(g) * up.float()).to(gate.dtype)
