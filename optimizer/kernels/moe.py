"""Top-k mixture of experts with SwiGLU experts: routing plus grouped expert GEMMs in Triton.

out[t] = sum over the token's top-k experts e of w[t,e] * (silu(x W_gate[e]) * (x W_up[e])) W_down[e],
with w the router softmax restricted to the top-k and renormalized (Mixtral's convention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from optimizer.kernels._common import DOT_PRECISION, check_dot_k, check_pow2, dot_upcast, next_pow2, require_cuda_or_interpreter

# 64-row token blocks (so an expert with a handful of tokens wastes at most one block), 64x64
# weight tiles, 4 warps: the vLLM fused-MoE default for small batches; the search sweeps it.
DEFAULTS = {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3}


@triton.jit
def _route_kernel(LOGITS, IDS, WEIGHTS, n_experts, stride_l, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                  RENORMALIZE: tl.constexpr):
    t = tl.program_id(0)
    re = tl.arange(0, BLOCK_E)
    logits = tl.load(LOGITS + t * stride_l + re, mask=re < n_experts, other=-float("inf")).to(tl.float32)
    p = tl.exp(logits - tl.max(logits, axis=0))
    p = p / tl.sum(p, axis=0)
    total = 0.0
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        # Ties go to the lowest expert index, as torch.topk does on CPU and GPU.
        idx = tl.min(tl.where(p == best, re, BLOCK_E), axis=0)
        tl.store(IDS + t * TOP_K + j, idx)
        tl.store(WEIGHTS + t * TOP_K + j, best)
        total += best
        p = tl.where(re == idx, -1.0, p)
    if RENORMALIZE:
        for j in tl.static_range(TOP_K):
            w = tl.load(WEIGHTS + t * TOP_K + j)
            tl.store(WEIGHTS + t * TOP_K + j, w / total)


@triton.jit
def _expert_up_kernel(
    X, WG, WU, H, SORTED, BLOCK_EXPERT, n_assign, F, K, top_k,
    stride_xt, stride_we, stride_wk, stride_wf, stride_h,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):
    blk = tl.program_id(0)
    e = tl.load(BLOCK_EXPERT + blk)
    rows = tl.load(SORTED + blk * BLOCK_M + tl.arange(0, BLOCK_M))  # assignment ids, n_assign = pad
    valid = rows < n_assign
    tokens = rows // top_k
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(X + tokens[:, None] * stride_xt + kk[None, :], mask=valid[:, None] & (kk[None, :] < K), other=0.0)
        w_off = e * stride_we + kk[:, None] * stride_wk + rn[None, :] * stride_wf
        w_mask = (kk[:, None] < K) & (rn[None, :] < F)
        wg = tl.load(WG + w_off, mask=w_mask, other=0.0)
        wu = tl.load(WU + w_off, mask=w_mask, other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
        acc_g = tl.dot(x, wg, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(x, wu, acc_u, input_precision=DOT_PRECISION)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(H + rows[:, None] * stride_h + rn[None, :], h.to(H.dtype.element_ty), mask=valid[:, None] & (rn[None, :] < F))


@triton.jit
def _expert_down_kernel(
    H, WD, OUT, SORTED, BLOCK_EXPERT, ROUTE_W, n_assign, N, K,
    stride_h, stride_we, stride_wk, stride_wn, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):
    blk = tl.program_id(0)
    e = tl.load(BLOCK_EXPERT + blk)
    rows = tl.load(SORTED + blk * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = rows < n_assign
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        h = tl.load(H + rows[:, None] * stride_h + kk[None, :], mask=valid[:, None] & (kk[None, :] < K), other=0.0)
        w = tl.load(WD + e * stride_we + kk[:, None] * stride_wk + rn[None, :] * stride_wn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, w, acc, input_precision=DOT_PRECISION)
    route_w = tl.load(ROUTE_W + rows, mask=valid, other=0.0)
    # Written per assignment row; the k rows of a token are summed afterwards (deterministic,
    # unlike atomics into the token row).
    tl.store(OUT + rows[:, None] * stride_o + rn[None, :], acc * route_w[:, None],
             mask=valid[:, None] & (rn[None, :] < N))


def route_topk(
    logits: torch.Tensor, top_k: int, *, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (expert ids [T, k] int32, weights [T, k] float32), Triton."""
    require_cuda_or_interpreter(logits)
    t, e = logits.shape
    logits = logits.contiguous()
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    _route_kernel[(t,)](logits, ids, weights, e, logits.stride(0), TOP_K=top_k, BLOCK_E=next_pow2(e),
                        RENORMALIZE=renormalize, num_warps=1)
    return ids, weights


def align_by_expert(ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort assignments by expert and pad each expert's run to whole row blocks.

    Returns (sorted assignment ids, padded with n_assign; the expert of each block). Blocks of
    experts with no tokens are not emitted.
    """
    flat = ids.reshape(-1).to(torch.int64)
    n_assign = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    blocks = (counts + block_m - 1) // block_m
    block_expert = torch.repeat_interleave(torch.arange(n_experts, device=ids.device), blocks)
    starts = torch.cumsum(counts, 0) - counts  # first sorted position of each expert
    padded_starts = (torch.cumsum(blocks, 0) - blocks) * block_m
    sorted_ids = torch.full((int(blocks.sum()) * block_m,), n_assign, dtype=torch.int64, device=ids.device)
    expert_of = flat[order]
    slot = padded_starts[expert_of] + torch.arange(n_assign, device=ids.device) - starts[expert_of]
    sorted_ids[slot] = order
    return sorted_ids, block_expert


def moe_triton(
    x: torch.Tensor,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    top_k: int = 2,
    renormalize: bool = True,
    block_m: int = DEFAULTS["block_m"],
    block_n: int = DEFAULTS["block_n"],
    block_k: int = DEFAULTS["block_k"],
    num_warps: int = DEFAULTS["num_warps"],
    num_stages: int = DEFAULTS["num_stages"],
) -> torch.Tensor:
    """x[T,H], router[H,E], w_gate/w_up[E,H,F], w_down[E,F,H] -> out[T,H]."""
    require_cuda_or_interpreter(x, router, w_gate, w_up, w_down)
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        check_pow2(name, value)
    check_dot_k("block_k", block_k)
    t, hidden = x.shape
    n_experts, _, f = w_gate.shape
    if router.shape != (hidden, n_experts) or w_up.shape != w_gate.shape or w_down.shape != (n_experts, f, hidden):
        raise ValueError(f"moe shapes disagree: x {tuple(x.shape)}, router {tuple(router.shape)}, w_gate "
                         f"{tuple(w_gate.shape)}, w_up {tuple(w_up.shape)}, w_down {tuple(w_down.shape)}")
    x = x.contiguous()
    ids, route_w = route_topk(x @ router, top_k, renormalize=renormalize)
    sorted_ids, block_expert = align_by_expert(ids, n_experts, block_m)
    n_assign = t * top_k
    n_blocks = block_expert.numel()
    h = torch.empty((n_assign, f), dtype=x.dtype, device=x.device)
    # Strided weights are read in place (Mixtral's fused gate_up parameter gives transposed views);
    # the two up-projections only need one layout between them.
    wg, wu, wd = w_gate, w_up, w_down
    if wg.stride() != wu.stride():
        wg, wu = wg.contiguous(), wu.contiguous()
    _expert_up_kernel[(n_blocks, triton.cdiv(f, block_n))](
        x, wg, wu, h, sorted_ids, block_expert, n_assign, f, hidden, top_k,
        x.stride(0), wg.stride(0), wg.stride(1), wg.stride(2), h.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=dot_upcast(),
        num_warps=num_warps, num_stages=num_stages,
    )
    out = torch.empty((n_assign, hidden), dtype=torch.float32, device=x.device)
    _expert_down_kernel[(n_blocks, triton.cdiv(hidden, block_n))](
        h, wd, out, sorted_ids, block_expert, route_w.reshape(-1), n_assign, hidden, f,
        h.stride(0), wd.stride(0), wd.stride(1), wd.stride(2), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=dot_upcast(),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out.view(t, top_k, hidden).sum(1).to(x.dtype)


def route_topk_torch(x: torch.Tensor, router: torch.Tensor, top_k: int, *, renormalize: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Router softmax in float32, top-k, renormalized: (ids [T,k] int64, weights [T,k] float32)."""
    probs = torch.softmax((x @ router).float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights


def moe_sorted(
    x: torch.Tensor, router: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    *, top_k: int = 2, renormalize: bool = True,
) -> torch.Tensor:
    """Grouped expert GEMMs on CPU: assignments sorted by expert once, each expert a contiguous
    slice; one gather of x and one weighted scatter-sum replace a mask and an index_add per expert."""
    t, hidden = x.shape
    ids, weights = route_topk_torch(x, router, top_k, renormalize=renormalize)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w_gate.shape[0]).tolist()
    xs = x.index_select(0, order // top_k)
    ys = torch.empty((t * top_k, hidden), dtype=x.dtype, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n:
            xe = xs[start:start + n]
            h = F.silu(xe @ w_gate[e]) * (xe @ w_up[e])
            torch.matmul(h, w_down[e], out=ys[start:start + n])
            start += n
    scale = weights.reshape(-1)[order].unsqueeze(-1)
    out = torch.zeros((t * top_k, hidden), dtype=torch.float32, device=x.device)
    out.index_copy_(0, order, ys.float() * scale)
    return out.view(t, top_k, hidden).sum(1).to(x.dtype)


def moe_padded_bmm(
    x: torch.Tensor, router: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    *, top_k: int = 2, renormalize: bool = True,
) -> torch.Tensor:
    """All experts in three batched GEMMs over a [E, capacity, H] padded token buffer: one call
    per projection instead of one per expert, at the cost of the padding rows' FLOPs."""
    t, hidden = x.shape
    n_experts = w_gate.shape[0]
    ids, weights = route_topk_torch(x, router, top_k, renormalize=renormalize)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    capacity = int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    expert_of = flat[order]
    slot = expert_of * capacity + torch.arange(flat.numel(), device=x.device) - starts[expert_of]
    xs = x.new_zeros((n_experts * capacity, hidden))
    xs[slot] = x.index_select(0, order // top_k)
    xs = xs.view(n_experts, capacity, hidden)
    h = F.silu(torch.bmm(xs, w_gate)) * torch.bmm(xs, w_up)
    ys = torch.bmm(h, w_down).view(n_experts * capacity, hidden)[slot]
    out = torch.zeros((t * top_k, hidden), dtype=torch.float32, device=x.device)
    out.index_copy_(0, order, ys.float() * weights.reshape(-1)[order].unsqueeze(-1))
    return out.view(t, top_k, hidden).sum(1).to(x.dtype)


def moe_eager(
    x: torch.Tensor, router: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    *, top_k: int = 2, renormalize: bool = True,
) -> torch.Tensor:
    """The eager formulation a Mixtral-style model runs (transformers' expert loop): a one-hot
    mask, a `where` and an index_add per expert hit. The baseline candidate, not an optimization."""
    n_experts = w_gate.shape[0]
    ids, weights = route_topk_torch(x, router, top_k, renormalize=renormalize)
    out = torch.zeros_like(x)
    mask = F.one_hot(ids, num_classes=n_experts).permute(2, 1, 0)  # [E, k, T]
    for e in (mask.sum(dim=(-1, -2)) > 0).nonzero().flatten().tolist():
        pos, tok = torch.where(mask[e])
        xe = x[tok]
        h = F.silu(xe @ w_gate[e]) * (xe @ w_up[e])
        y = (h @ w_down[e]) * weights[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out
