"""Float64 references of the suite's math for the optimizer's tests, and dtype-aware tolerances.

Written from the definitions in DESIGN.md, independently of the kernels under test.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-6

# (atol, rtol) per dtype: a few units in the last place of the output dtype at magnitude ~1.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (4e-2, 4e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    atol, rtol = TOLERANCES[dtype]
    assert actual.dtype == dtype, f"output dtype {actual.dtype}, expected {dtype}"
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol * scale, rtol=rtol)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w.double()


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    x = x.double()
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w.double() + b.double()


def softmax(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    g = g.double()
    return g / (1 + torch.exp(-g)) * u.double()


def rope_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x = x.double()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.double() + rotated * sin.double()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s_q, s_k = scores.shape[-2:]
        keep = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v


def moe(x, router, w_gate, w_up, w_down, top_k: int = 2) -> torch.Tensor:
    x, router, w_gate, w_up, w_down = (t.double() for t in (x, router, w_gate, w_up, w_down))
    probs = torch.softmax(x @ router, -1)
    weights, ids = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(top_k):
            e = int(ids[t, j])
            g = x[t] @ w_gate[e]
            h = g / (1 + torch.exp(-g)) * (x[t] @ w_up[e])
            out[t] += weights[t, j] * (h @ w_down[e])
    return out


def ssm_scan(u, delta, A, B, C, D, softplus: bool = False) -> torch.Tensor:
    u, delta, A, B, C, D = (t.double() for t in (u, delta, A, B, C, D))
    if softplus:
        delta = torch.nn.functional.softplus(delta)
    batch, d_model, seq_len = u.shape
    h = torch.zeros(batch, d_model, A.shape[1], dtype=torch.float64, device=u.device)
    ys = []
    for t in range(seq_len):
        h = torch.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t] * u[:, :, t])[:, :, None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1) + D * u[:, :, t])
    return torch.stack(ys, dim=-1)


def rope_tables(seq_len: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()
