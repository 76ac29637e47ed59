"""Dense GEMM c = a @ b: a tiled Triton kernel (grouped tile order, split-K, persistent) and torch.

Accumulates in float32 and writes the input dtype, as cuBLAS does for bf16/fp16 by default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimizer.kernels._common import DOT_PRECISION, check_dot_k, check_pow2, dot_upcast, require_cuda_or_interpreter

# Defaults: 128x128x64 tiles, 8 warps, 3 stages, GROUP_M=8 is the Triton matmul tutorial's
# first H100 config for bf16; the search sweeps the tutorial's other configs around it.
DEFAULTS = {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 3}


@triton.jit
def _gemm_kernel(
    A, B, C, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cs, stride_cm, stride_cn,
    n_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, UPCAST: tl.constexpr,
):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    tiles_mn = num_m * num_n
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    # Persistent when launched with fewer programs than tiles: each program strides the tiles.
    for tile in range(tl.program_id(0), tiles_mn * SPLIT_K, n_programs):
        split = tile // tiles_mn
        t = tile % tiles_mn
        # Grouped ordering: GROUP_M row-tiles share their B columns while they are in L2.
        group = GROUP_M * num_n
        first_m = (t // group) * GROUP_M
        group_rows = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (t % group) % group_rows
        pid_n = (t % group) // group_rows
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_start = split * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        for k0 in range(k_start, k_end, BLOCK_K):
            kk = k0 + rk
            a = tl.load(A + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & (kk[None, :] < k_end), other=0.0)
            b = tl.load(B + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=(kk[:, None] < k_end) & (rn[None, :] < N), other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        c_ptrs = C + split * stride_cs + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm_triton(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    block_m: int = DEFAULTS["block_m"],
    block_n: int = DEFAULTS["block_n"],
    block_k: int = DEFAULTS["block_k"],
    group_m: int = DEFAULTS["group_m"],
    num_warps: int = DEFAULTS["num_warps"],
    num_stages: int = DEFAULTS["num_stages"],
    split_k: int = 1,
    persistent_programs: int | None = None,
) -> torch.Tensor:
    """a[M,K] @ b[K,N]. split_k > 1 reduces fp32 partials in a workspace (deterministic, no
    atomics); persistent_programs caps the grid (e.g. the SM count) and loops over tiles."""
    require_cuda_or_interpreter(a, b)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm needs a[M,K] and b[K,N], got {tuple(a.shape)} and {tuple(b.shape)}")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        check_pow2(name, value)
    check_dot_k("block_k", block_k)
    m, k = a.shape
    n = b.shape[1]
    if split_k > 1:
        out = torch.empty((split_k, m, n), dtype=torch.float32, device=a.device)
    else:
        out = torch.empty((1, m, n), dtype=a.dtype, device=a.device)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n) * split_k
    n_programs = min(tiles, persistent_programs) if persistent_programs else tiles
    _gemm_kernel[(n_programs,)](
        a, b, out, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), out.stride(2),
        n_programs,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, SPLIT_K=split_k,
        UPCAST=dot_upcast(), num_warps=num_warps, num_stages=num_stages,
    )
    if split_k > 1:
        return out.sum(0).to(a.dtype)
    return out[0]


def gemm_chunked(a: torch.Tensor, b: torch.Tensor, *, chunk_n: int) -> torch.Tensor:
    """a @ b computed in column panels of b: keeps each panel of b cache-resident on CPU."""
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    for start in range(0, b.shape[1], chunk_n):
        torch.matmul(a, b[:, start:start + chunk_n], out=out[:, start:start + chunk_n])
    return out
