"""Mamba selective scan, y = scan(u, delta, A, B, C) + D*u: chunked Triton kernels and torch forms.

h_t = exp(delta_t A) * h_{t-1} + delta_t u_t B_t,  y_t = <h_t, C_t> + D u_t, with u, delta [B, Dm, L],
A [Dm, N], B and C [B, N, L], D [Dm] (the layout of Mamba's selective_scan_ref).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from optimizer.kernels._common import check_pow2, next_pow2, require_cuda_or_interpreter

# 32 channels x a 16-wide state per program, 4 warps; chunk 256 splits a 2k-token prefill into 8
# parallel chunks. Starting points (Mamba's own kernel scans 2048-token chunks per block); swept.
DEFAULTS = {"block_d": 32, "chunk": 256, "num_warps": 4}


@triton.jit
def _ssm_chunk_kernel(
    U, DELTA, A, B, C, D, Y, H_IN, H_END, DECAY_LOG, seq_len, d_model, d_state, chunk,
    stride_ub, stride_ud, stride_bb, stride_bn,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SOFTPLUS: tl.constexpr,
    HAS_INIT: tl.constexpr, WRITE_Y: tl.constexpr,
):
    """Scan one chunk of one channel block. Pass 1 (WRITE_Y=False) only summarizes the chunk:
    its end state from a zero start and its total log-decay per channel. Pass 2 rescans it from
    the true incoming state and writes y."""
    b = tl.program_id(0)
    rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c = tl.program_id(2)
    n_chunks = tl.num_programs(2)
    rn = tl.arange(0, BLOCK_N)
    dmask = rd < d_model
    nmask = rn < d_state
    mask2 = dmask[:, None] & nmask[None, :]
    a = tl.load(A + rd[:, None] * d_state + rn[None, :], mask=mask2, other=0.0).to(tl.float32)
    state_off = ((b * n_chunks + c) * d_model + rd[:, None]) * d_state + rn[None, :]
    if HAS_INIT:
        h = tl.load(H_IN + state_off, mask=mask2, other=0.0)
    else:
        h = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    if WRITE_Y:
        d_skip = tl.load(D + rd, mask=dmask, other=0.0).to(tl.float32)
    delta_sum = tl.zeros([BLOCK_D], dtype=tl.float32)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    for t in range(lo, hi):
        u = tl.load(U + b * stride_ub + rd * stride_ud + t, mask=dmask, other=0.0).to(tl.float32)
        dt = tl.load(DELTA + b * stride_ub + rd * stride_ud + t, mask=dmask, other=0.0).to(tl.float32)
        if SOFTPLUS:
            dt = tl.where(dt > 20.0, dt, tl.log(1.0 + tl.exp(dt)))
        bt = tl.load(B + b * stride_bb + rn * stride_bn + t, mask=nmask, other=0.0).to(tl.float32)
        h = tl.exp(dt[:, None] * a) * h + (dt * u)[:, None] * bt[None, :]
        delta_sum += dt
        if WRITE_Y:
            ct = tl.load(C + b * stride_bb + rn * stride_bn + t, mask=nmask, other=0.0).to(tl.float32)
            y = tl.sum(h * ct[None, :], axis=1) + d_skip * u
            tl.store(Y + b * stride_ub + rd * stride_ud + t, y.to(Y.dtype.element_ty), mask=dmask)
    if not WRITE_Y:
        tl.store(H_END + state_off, h, mask=mask2)
        # prod_t exp(delta_t A) = exp(A * sum_t delta_t): the chunk's decay of an incoming state.
        tl.store(DECAY_LOG + state_off, a * delta_sum[:, None], mask=mask2)


@triton.jit
def _ssm_carry_kernel(H_END, DECAY_LOG, H_IN, d_model, d_state, n_chunks,
                      BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Sequential over chunks, parallel over channels: h_in[c] = decay[c-1] h_in[c-1] + h_end[c-1]."""
    b = tl.program_id(0)
    rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    rn = tl.arange(0, BLOCK_N)
    mask2 = (rd[:, None] < d_model) & (rn[None, :] < d_state)
    h = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    for c in range(n_chunks):
        off = ((b * n_chunks + c) * d_model + rd[:, None]) * d_state + rn[None, :]
        tl.store(H_IN + off, h, mask=mask2)
        h = tl.exp(tl.load(DECAY_LOG + off, mask=mask2, other=0.0)) * h + tl.load(H_END + off, mask=mask2, other=0.0)


def ssm_scan_triton(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    *,
    delta_softplus: bool = False,
    block_d: int = DEFAULTS["block_d"],
    chunk: int = DEFAULTS["chunk"],
    num_warps: int = DEFAULTS["num_warps"],
) -> torch.Tensor:
    """Chunked selective scan. chunk >= L is a single pass; otherwise three launches (summaries,
    carry, rescan) trade one extra read of u/delta/B for parallelism over the sequence."""
    require_cuda_or_interpreter(u, delta, A, B, C, D)
    check_pow2("block_d", block_d)
    batch, d_model, seq_len = u.shape
    d_state = A.shape[1]
    if delta.shape != u.shape or A.shape[0] != d_model or B.shape != (batch, d_state, seq_len) \
            or C.shape != B.shape or D.shape != (d_model,):
        raise ValueError(f"ssm_scan shapes disagree: u {tuple(u.shape)}, delta {tuple(delta.shape)}, A "
                         f"{tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}, D {tuple(D.shape)}")
    u, delta, A, B, C, D = (t.contiguous() for t in (u, delta, A, B, C, D))
    y = torch.empty_like(u)
    chunk = max(1, min(chunk, seq_len))
    n_chunks = triton.cdiv(seq_len, chunk)
    block_n = next_pow2(d_state)
    grid = (batch, triton.cdiv(d_model, block_d), n_chunks)
    common = dict(BLOCK_D=block_d, BLOCK_N=block_n, SOFTPLUS=delta_softplus, num_warps=num_warps)
    strides = (u.stride(0), u.stride(1), B.stride(0), B.stride(1))
    if n_chunks == 1:
        _ssm_chunk_kernel[grid](u, delta, A, B, C, D, y, y, y, y, seq_len, d_model, d_state, chunk, *strides,
                                HAS_INIT=False, WRITE_Y=True, **common)
        return y
    states = torch.empty((3, batch, n_chunks, d_model, d_state), dtype=torch.float32, device=u.device)
    h_end, decay_log, h_in = states[0], states[1], states[2]
    _ssm_chunk_kernel[grid](u, delta, A, B, C, D, y, h_in, h_end, decay_log, seq_len, d_model, d_state, chunk,
                            *strides, HAS_INIT=False, WRITE_Y=False, **common)
    _ssm_carry_kernel[(batch, triton.cdiv(d_model, block_d))](
        h_end, decay_log, h_in, d_model, d_state, n_chunks, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=num_warps)
    _ssm_chunk_kernel[grid](u, delta, A, B, C, D, y, h_in, h_end, decay_log, seq_len, d_model, d_state, chunk,
                            *strides, HAS_INIT=True, WRITE_Y=True, **common)
    return y


def _discretize_inputs(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
    delta_softplus: bool,
) -> tuple[torch.Tensor, ...]:
    u, delta, A, B, C, D = (t.float() for t in (u, delta, A, B, C, D))
    if delta_softplus:
        delta = F.softplus(delta)
    return u, delta, A, B, C, D


def ssm_scan_loop(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
    *, delta_softplus: bool = False,
) -> torch.Tensor:
    """Sequential scan with the discretization hoisted out of the loop: one addcmul per step,
    and the output contraction done once over all stored states."""
    dtype = u.dtype
    u, delta, A, B, C, D = _discretize_inputs(u, delta, A, B, C, D, delta_softplus)
    decay = torch.exp(delta.unsqueeze(-1) * A[:, None, :])  # [B, Dm, L, N]
    drive = (delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1)  # [B, Dm, L, N]
    states = torch.empty_like(decay)
    h = torch.zeros_like(decay[:, :, 0])
    for t in range(u.shape[-1]):
        h = torch.addcmul(drive[:, :, t], decay[:, :, t], h)
        states[:, :, t] = h
    y = torch.einsum("bdln,bnl->bdl", states, C)
    return (y + D[:, None] * u).to(dtype)


def ssm_chunk_step(
    h: torch.Tensor, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, Bt: torch.Tensor, Ct: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance state h[B,Dm,N] over one chunk of T steps (unrolled): returns (end state, y[B,Dm,T]).

    u, delta: [B,Dm,T]; Bt, Ct: [B,T,N] (time-major, so each step reads one contiguous N-vector).
    Under torch.compile the T steps fuse into one loop nest vectorized over N that never writes
    the discretized [B,Dm,T,N] tensors. The states are stacked [B,Dm,T,N] and contracted with C
    once: torch 2.13's inductor miscompiled the alternative of T per-step reductions stacked
    together (wrong y for interior steps at T=32; caught by the float64 check).
    """
    states = []
    for t in range(u.shape[-1]):
        h = torch.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t] * u[:, :, t])[:, :, None] * Bt[:, None, t, :]
        states.append(h)
    y = (torch.stack(states, dim=2) * Ct[:, None]).sum(-1)
    return h, y


def ssm_scan_chunked(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
    *, chunk: int, delta_softplus: bool = False,
    step: Callable[..., tuple[torch.Tensor, torch.Tensor]] = ssm_chunk_step,
) -> torch.Tensor:
    """Scan chunk by chunk with `step` (ssm_chunk_step, or a torch.compile of it)."""
    dtype = u.dtype
    u, delta, A, B, C, D = _discretize_inputs(u, delta, A, B, C, D, delta_softplus)
    bt = B.transpose(1, 2).contiguous()
    ct = C.transpose(1, 2).contiguous()
    h = u.new_zeros((u.shape[0], u.shape[1], A.shape[1]))
    ys = []
    for start in range(0, u.shape[-1], chunk):
        stop = start + chunk
        h, y = step(h, u[:, :, start:stop], delta[:, :, start:stop], A, bt[:, start:stop], ct[:, start:stop])
        ys.append(y)
    return (torch.cat(ys, dim=-1) + D[:, None] * u).to(dtype)


def ssm_scan_eager(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
    *, delta_softplus: bool = False,
) -> torch.Tensor:
    """The eager formulation Mamba's reference scan (and transformers' CPU path) runs: discretize
    to [B,Dm,L,N], then a Python loop of a multiply-add and a contraction per step. The baseline
    candidate, not an optimization."""
    dtype = u.dtype
    u, delta, A, B, C, D = _discretize_inputs(u, delta, A, B, C, D, delta_softplus)
    decay = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    drive = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    h = u.new_zeros((u.shape[0], u.shape[1], A.shape[1]))
    ys = []
    for t in range(u.shape[-1]):
        h = decay[:, :, t] * h + drive[:, :, t]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, t]))
    return (torch.stack(ys, dim=2) + u * D[:, None]).to(dtype)
