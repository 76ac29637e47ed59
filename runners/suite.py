"""Suite v1: the workloads, their shapes per profile, input generators, honest baselines, references.

Everything here defines what a result means, so all of it feeds `manifest_sha256(profile)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from runners.names import SUITE_VERSION  # noqa: F401  (re-exported: the suite's version lives with its names)

EPS = 1e-6
MOE_TOP_K = 2
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Every profile checks correctness on each of these; timing rounds use "normal".
DISTRIBUTIONS: tuple[str, ...] = ("normal", "uniform", "outliers", "heavy_tailed", "small")
# (atol, rtol) per dtype. The rule (runners/checks.compare_tensors) is
# |out - ref| <= atol * rms_row(ref) + rtol * |ref|: atol is relative to the RMS of the output row
# because a GEMM with K=4096 has outputs near 64, where summation order alone moves an element by
# more than any fixed absolute atol that would still catch a wrong softmax (outputs near 1/C).
_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "bfloat16": (2e-2, 2e-2),
    "float16": (4e-3, 4e-3),
}
# Low-precision atol multipliers for workloads whose honest eager form loses more than one
# rounding: Mixtral's router logits come out of a bf16 matmul, so the routing softmax weights
# move by up to |logit| * 2^-9 in relative terms and the bf16 baseline itself lands up to ~4% of
# a row's RMS away from the float64 result (measured over all distributions, seeds 0-7).
_LOW_PRECISION_ATOL_SCALE: dict[str, float] = {"moe": 3.0}
# float32 atol multipliers, for the same reason: eager fp32 attention on `outliers` inputs (a few
# huge logits, a softmax close to one-hot) lands up to 1.7x the float32 atol from the float64 result
# at the `cpu` shape (1 draw in 400 over it, seeds 0-399; 1 in 60 in another seed set), so an honest
# kernel identical to the baseline failed its own check in ~1-5% of audits (seen in
# benchmarks/harness.py, 2026-12-02). x4 leaves 2.4x over the worst draw seen; a wrong softmax,
# scale or mask is off by a sizeable share of the row's RMS, far above it.
_FLOAT32_ATOL_SCALE: dict[str, float] = {"attention_prefill": 4.0}
# MoE routing within this relative logit gap of a tie may legitimately go either way in a
# low-precision dtype; those tokens are left out of the comparison (see `check_mask`).
_ROUTING_TIE_GAP: dict[str, float] = {"float32": 1e-5, "bfloat16": 3e-2, "float16": 4e-3}


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload at one shape and dtype in a profile."""

    name: str
    family: str
    shape: dict[str, int]
    dtype: str

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def key(self) -> str:
        """A stable, readable identity such as `rmsnorm[R=32,H=256]float32`."""
        dims = ",".join(f"{k}={v}" for k, v in self.shape.items())
        return f"{self.name}[{dims}]{self.dtype}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "shape": dict(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadSpec:
        spec = cls(
            name=str(data["name"]),
            family=str(data["family"]),
            shape={str(k): int(v) for k, v in dict(data["shape"]).items()},
            dtype=str(data["dtype"]),
        )
        _workload(spec.name)
        if spec.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {spec.dtype!r}; use one of {sorted(DTYPES)}")
        return spec


@dataclass(frozen=True)
class InputLayout:
    """One input of a workload: its shape and what kind of values it holds.

    `row_align` (elements) is the granularity at which the harness may shift a view into a larger
    pool of generated values without breaking the input's structure (RoPE tables keep whole rows).
    Inputs sharing a `group` are drawn from one seed and always shifted together (cos and sin
    tables must describe the same positions).
    """

    name: str
    shape: tuple[int, ...]
    kind: str
    scale: float = 1.0
    row_align: int = 1
    group: str = ""

    @property
    def seed_name(self) -> str:
        return self.group or self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "kind": self.kind,
            "scale": self.scale,
            "row_align": self.row_align,
            "group": self.group,
        }

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# --------------------------------------------------------------------------------------------
# Value generation. Distributions apply to activations; weights, tables and constrained inputs
# (Mamba's positive delta and negative A) have fixed generators so every input stays meaningful.


def _sample_distribution(
    distribution: str, shape: tuple[int, ...], generator: torch.Generator, device: str
) -> torch.Tensor:
    def normal() -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)

    def unit() -> torch.Tensor:
        return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)

    if distribution == "normal":
        return normal()
    if distribution == "uniform":
        return (unit() * 2.0 - 1.0) * math.sqrt(3.0)
    if distribution == "outliers":
        # Activation outliers as in LLM residual streams: 0.5% of entries 30x larger.
        values = normal()
        return torch.where(unit() < 0.005, values * 30.0, values)
    if distribution == "heavy_tailed":
        # Student-t with 3 degrees of freedom, scaled to unit variance.
        chi2 = normal().square() + normal().square() + normal().square()
        return normal() / torch.sqrt(chi2 / 3.0).clamp_min(1e-6) / math.sqrt(3.0)
    if distribution == "small":
        # Mean square 1e-5, ten times eps: a norm that drops or changes eps is off by 5%.
        return normal() * 3e-3
    raise ValueError(f"unknown distribution {distribution!r}; use one of {list(DISTRIBUTIONS)}")


def _rope_table(kind: str, shape: tuple[int, ...], generator: torch.Generator, device: str) -> torch.Tensor:
    rows, dim = shape[0], shape[-1]
    start = int(torch.randint(0, 1 << 16, (1,), generator=generator, device=device).item())
    positions = torch.arange(start, start + rows, device=device, dtype=torch.float64)
    inv_freq = 500_000.0 ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat([freqs, freqs], dim=-1)  # Llama layout: both halves share frequencies
    table = torch.cos(angles) if kind == "rope_cos" else torch.sin(angles)
    return table.to(torch.float32)


def generate_tensor(
    layout: InputLayout,
    shape: tuple[int, ...],
    *,
    seed: int,
    dtype: torch.dtype,
    device: str,
    distribution: str,
) -> torch.Tensor:
    """Values of `layout`'s kind in `shape` (which may be larger than the layout, for pools)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    kind = layout.kind
    if kind == "activation":
        values = _sample_distribution(distribution, shape, generator, device)
    elif kind == "weight":
        values = torch.randn(shape, generator=generator, device=device)
    elif kind == "norm_weight":
        values = 1.0 + 0.1 * torch.randn(shape, generator=generator, device=device)
    elif kind == "bias":
        values = 0.1 * torch.randn(shape, generator=generator, device=device)
    elif kind == "positive":  # Mamba's delta after softplus
        values = F.softplus(torch.randn(shape, generator=generator, device=device) - 1.0)
    elif kind == "negative":  # Mamba's A = -exp(A_log)
        values = -torch.exp(0.5 * torch.randn(shape, generator=generator, device=device))
    elif kind in ("rope_cos", "rope_sin"):
        values = _rope_table(kind, shape, generator, device)
    else:
        raise ValueError(f"unknown input kind {kind!r}")
    return (values * layout.scale).to(dtype)


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed derived one-way from `seed`, so a child given one cannot predict the others."""
    text = ":".join([str(seed), *map(str, parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


# --------------------------------------------------------------------------------------------
# Baselines: what eager PyTorch runs with the library's standard ops. Never a straw man.


def rmsnorm_baseline(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def layernorm_baseline(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, EPS)


def softmax_baseline(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def swiglu_baseline(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_baseline(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # transformers' apply_rotary_pos_emb, which Llama-family models run by default.
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def gemm_baseline(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def attention_prefill_baseline(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def attention_decode_baseline(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)


def moe_baseline(
    x: torch.Tensor,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    # transformers' Mixtral sparse MoE block: float32 routing softmax, top-2, renormalised
    # weights, then a loop over experts with the tokens each one received.
    probs = torch.softmax(x @ router, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, MOE_TOP_K, dim=-1)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(x)
    for expert in range(router.shape[1]):
        tokens, slot = torch.where(experts == expert)
        if tokens.numel() == 0:
            continue
        xe = x[tokens]
        hidden = F.silu(xe @ w_gate[expert]) * (xe @ w_up[expert])
        out.index_add_(0, tokens, (hidden @ w_down[expert]) * weights[tokens, slot, None])
    return out


def ssm_scan_baseline(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
) -> torch.Tensor:
    # The sequential reference scan Mamba models fall back to without fused kernels, in float32.
    batch, dim, length = u.shape
    u32, delta32 = u.float(), delta.float()
    delta_a = torch.exp(delta32.unsqueeze(-1) * A.float()[None, :, None, :])  # [b, d, l, n]
    delta_b_u = (delta32 * u32).unsqueeze(-1) * B.float().transpose(1, 2)[:, None, :, :]
    state = u32.new_zeros(batch, dim, A.shape[1])
    ys = []
    c32 = C.float()
    for step in range(length):
        state = delta_a[:, :, step] * state + delta_b_u[:, :, step]
        ys.append(torch.einsum("bdn,bn->bd", state, c32[:, :, step]))
    y = torch.stack(ys, dim=2) + u32 * D.float()[None, :, None]
    return y.to(u.dtype)


# --------------------------------------------------------------------------------------------
# References: float64 formulations written from the math, independent of the baselines' ops.


def _f64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(torch.float64) for t in tensors]


def _rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x, weight = _f64(x, weight)
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + EPS) * weight


def _layernorm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    x, weight, bias = _f64(x, weight, bias)
    centered = x - x.mean(dim=-1, keepdim=True)
    return centered * torch.rsqrt(centered.square().mean(dim=-1, keepdim=True) + EPS) * weight + bias


def _softmax_reference(x: torch.Tensor) -> torch.Tensor:
    (x,) = _f64(x)
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def _swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate, up = _f64(gate, up)
    return gate / (1.0 + torch.exp(-gate)) * up


def _rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, cos, sin = _f64(q, k, cos, sin)
    half = q.shape[-1] // 2

    def rotate(t: torch.Tensor) -> torch.Tensor:
        x1, x2 = t[..., :half], t[..., half:]
        c1, c2, s1, s2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]
        return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)

    return rotate(q), rotate(k)


def _gemm_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = _f64(a, b)
    return a @ b


def _attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    q, k, v = _f64(q, k, v)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = scores.shape[-2], scores.shape[-1]
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (probs / probs.sum(dim=-1, keepdim=True)) @ v


def _attention_prefill_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _attention_reference(q, k, v, causal=True)


def _attention_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    return _attention_reference(q, k_cache, v_cache, causal=False)


def _moe_reference(
    x: torch.Tensor,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    x, router = _f64(x, router)
    logits = x @ router
    top_logits, experts = torch.topk(logits, MOE_TOP_K, dim=-1)
    # Softmax over all experts then renormalising the top-k equals a softmax over the top-k.
    weights = torch.softmax(top_logits, dim=-1)
    out = torch.zeros_like(x)
    for expert in range(router.shape[1]):
        tokens, slot = torch.where(experts == expert)
        if tokens.numel() == 0:
            continue
        wg, wu, wd = _f64(w_gate[expert], w_up[expert], w_down[expert])
        xe = x[tokens]
        gate = xe @ wg
        hidden = gate / (1.0 + torch.exp(-gate)) * (xe @ wu)
        out.index_add_(0, tokens, (hidden @ wd) * weights[tokens, slot, None])
    return out


def _ssm_scan_reference(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
) -> torch.Tensor:
    u, delta, A, B, C, D = _f64(u, delta, A, B, C, D)
    state = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=torch.float64, device=u.device)
    ys = []
    for step in range(u.shape[2]):
        dt = delta[:, :, step, None]  # [b, d, 1]
        state = torch.exp(dt * A) * state + dt * u[:, :, step, None] * B[:, None, :, step]
        ys.append((state * C[:, None, :, step]).sum(dim=-1))
    return torch.stack(ys, dim=2) + u * D[None, :, None]


# --------------------------------------------------------------------------------------------
# The registry: one entry per workload.


def _elsize(dtype: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


@dataclass(frozen=True)
class _Workload:
    name: str
    family: str
    baseline: Callable[..., Any]
    baseline_impl: str
    reference: Callable[..., Any]
    layouts: Callable[[dict[str, int]], list[InputLayout]]
    outputs: Callable[[dict[str, int]], list[tuple[int, ...]]]
    flops: Callable[[dict[str, int]], int]
    # Compulsory traffic in elements: every input read once and every output written once,
    # which is what a physical-floor check may assume.
    elements_moved: Callable[[dict[str, int]], int]


def _moe_elements(s: dict[str, int]) -> int:
    # Only the experts some token can reach must be read: at most top_k * T of them.
    experts_read = min(s["E"], MOE_TOP_K * s["T"])
    return 2 * s["T"] * s["H"] + s["H"] * s["E"] + experts_read * 3 * s["H"] * s["F"]


_WORKLOADS: dict[str, _Workload] = {
    w.name: w
    for w in [
        _Workload(
            name="rmsnorm",
            family="normalization",
            baseline=rmsnorm_baseline,
            baseline_impl="torch eager: F.rms_norm",
            reference=_rmsnorm_reference,
            layouts=lambda s: [
                InputLayout("x", (s["R"], s["H"]), "activation"),
                InputLayout("weight", (s["H"],), "norm_weight"),
            ],
            outputs=lambda s: [(s["R"], s["H"])],
            flops=lambda s: 4 * s["R"] * s["H"],
            elements_moved=lambda s: 2 * s["R"] * s["H"] + s["H"],
        ),
        _Workload(
            name="layernorm",
            family="normalization",
            baseline=layernorm_baseline,
            baseline_impl="torch eager: F.layer_norm",
            reference=_layernorm_reference,
            layouts=lambda s: [
                InputLayout("x", (s["R"], s["H"]), "activation"),
                InputLayout("weight", (s["H"],), "norm_weight"),
                InputLayout("bias", (s["H"],), "bias"),
            ],
            outputs=lambda s: [(s["R"], s["H"])],
            flops=lambda s: 8 * s["R"] * s["H"],
            elements_moved=lambda s: 2 * s["R"] * s["H"] + 2 * s["H"],
        ),
        _Workload(
            name="softmax",
            family="activation",
            baseline=softmax_baseline,
            baseline_impl="torch eager: torch.softmax",
            reference=_softmax_reference,
            layouts=lambda s: [InputLayout("x", (s["R"], s["C"]), "activation")],
            outputs=lambda s: [(s["R"], s["C"])],
            flops=lambda s: 5 * s["R"] * s["C"],
            elements_moved=lambda s: 2 * s["R"] * s["C"],
        ),
        _Workload(
            name="swiglu",
            family="activation",
            baseline=swiglu_baseline,
            baseline_impl="torch eager: F.silu(gate) * up",
            reference=_swiglu_reference,
            layouts=lambda s: [
                InputLayout("gate", (s["R"], s["F"]), "activation"),
                InputLayout("up", (s["R"], s["F"]), "activation"),
            ],
            outputs=lambda s: [(s["R"], s["F"])],
            flops=lambda s: 6 * s["R"] * s["F"],
            elements_moved=lambda s: 3 * s["R"] * s["F"],
        ),
        _Workload(
            name="rope",
            family="positional",
            baseline=rope_baseline,
            baseline_impl="torch eager: transformers apply_rotary_pos_emb",
            reference=_rope_reference,
            layouts=lambda s: [
                InputLayout("q", (s["B"], s["H"], s["S"], s["D"]), "activation"),
                InputLayout("k", (s["B"], s["Hkv"], s["S"], s["D"]), "activation"),
                InputLayout("cos", (s["S"], s["D"]), "rope_cos", row_align=s["D"], group="positions"),
                InputLayout("sin", (s["S"], s["D"]), "rope_sin", row_align=s["D"], group="positions"),
            ],
            outputs=lambda s: [(s["B"], s["H"], s["S"], s["D"]), (s["B"], s["Hkv"], s["S"], s["D"])],
            flops=lambda s: 3 * s["B"] * (s["H"] + s["Hkv"]) * s["S"] * s["D"],
            elements_moved=lambda s: 2 * s["B"] * (s["H"] + s["Hkv"]) * s["S"] * s["D"] + 2 * s["S"] * s["D"],
        ),
        _Workload(
            name="gemm",
            family="gemm",
            baseline=gemm_baseline,
            baseline_impl="torch eager: torch.matmul",
            reference=_gemm_reference,
            layouts=lambda s: [
                InputLayout("a", (s["M"], s["K"]), "activation"),
                InputLayout("b", (s["K"], s["N"]), "weight", scale=1.0 / math.sqrt(s["K"])),
            ],
            outputs=lambda s: [(s["M"], s["N"])],
            flops=lambda s: 2 * s["M"] * s["N"] * s["K"],
            elements_moved=lambda s: s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"],
        ),
        _Workload(
            name="attention_prefill",
            family="attention",
            baseline=attention_prefill_baseline,
            baseline_impl="torch eager: F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)",
            reference=_attention_prefill_reference,
            layouts=lambda s: [
                InputLayout("q", (s["B"], s["Hq"], s["S"], s["D"]), "activation"),
                InputLayout("k", (s["B"], s["Hkv"], s["S"], s["D"]), "activation"),
                InputLayout("v", (s["B"], s["Hkv"], s["S"], s["D"]), "activation"),
            ],
            outputs=lambda s: [(s["B"], s["Hq"], s["S"], s["D"])],
            # QK^T and PV over the causal half.
            flops=lambda s: 2 * s["B"] * s["Hq"] * s["S"] * s["S"] * s["D"],
            elements_moved=lambda s: 2 * s["B"] * (s["Hq"] + s["Hkv"]) * s["S"] * s["D"],
        ),
        _Workload(
            name="attention_decode",
            family="attention",
            baseline=attention_decode_baseline,
            baseline_impl="torch eager: F.scaled_dot_product_attention(enable_gqa=True)",
            reference=_attention_decode_reference,
            layouts=lambda s: [
                InputLayout("q", (s["B"], s["Hq"], 1, s["D"]), "activation"),
                InputLayout("k_cache", (s["B"], s["Hkv"], s["L"], s["D"]), "activation"),
                InputLayout("v_cache", (s["B"], s["Hkv"], s["L"], s["D"]), "activation"),
            ],
            outputs=lambda s: [(s["B"], s["Hq"], 1, s["D"])],
            flops=lambda s: 4 * s["B"] * s["Hq"] * s["L"] * s["D"],
            elements_moved=lambda s: 2 * s["B"] * s["Hq"] * s["D"] + 2 * s["B"] * s["Hkv"] * s["L"] * s["D"],
        ),
        _Workload(
            name="moe",
            family="moe",
            baseline=moe_baseline,
            baseline_impl="torch eager: transformers Mixtral sparse MoE block (top-2)",
            reference=_moe_reference,
            layouts=lambda s: [
                InputLayout("x", (s["T"], s["H"]), "activation"),
                InputLayout("router", (s["H"], s["E"]), "weight", scale=1.0 / math.sqrt(s["H"])),
                InputLayout("w_gate", (s["E"], s["H"], s["F"]), "weight", scale=1.0 / math.sqrt(s["H"])),
                InputLayout("w_up", (s["E"], s["H"], s["F"]), "weight", scale=1.0 / math.sqrt(s["H"])),
                InputLayout("w_down", (s["E"], s["F"], s["H"]), "weight", scale=1.0 / math.sqrt(s["F"])),
            ],
            outputs=lambda s: [(s["T"], s["H"])],
            flops=lambda s: 2 * s["T"] * s["H"] * s["E"] + MOE_TOP_K * 6 * s["T"] * s["H"] * s["F"],
            elements_moved=_moe_elements,
        ),
        _Workload(
            name="ssm_scan",
            family="ssm",
            baseline=ssm_scan_baseline,
            baseline_impl="torch eager: sequential selective scan (Mamba reference path)",
            reference=_ssm_scan_reference,
            layouts=lambda s: [
                InputLayout("u", (s["B"], s["D"], s["L"]), "activation"),
                InputLayout("delta", (s["B"], s["D"], s["L"]), "positive"),
                InputLayout("A", (s["D"], s["N"]), "negative"),
                InputLayout("B", (s["B"], s["N"], s["L"]), "activation"),
                InputLayout("C", (s["B"], s["N"], s["L"]), "activation"),
                InputLayout("D", (s["D"],), "weight"),
            ],
            outputs=lambda s: [(s["B"], s["D"], s["L"])],
            flops=lambda s: 7 * s["B"] * s["D"] * s["L"] * s["N"],
            elements_moved=lambda s: 3 * s["B"] * s["D"] * s["L"] + 2 * s["B"] * s["N"] * s["L"]
            + s["D"] * s["N"]
            + s["D"],
        ),
    ]
}

# --------------------------------------------------------------------------------------------
# Profiles. Shapes name the model they come from where they have one.

_Entry = tuple[str, dict[str, int], str]

_PROFILES: dict[str, tuple[_Entry, ...]] = {
    # Tiny shapes for tests and CI: the whole profile audits in well under three minutes on
    # two cores. Odd sizes on purpose, so kernels that assume powers of two are caught.
    "cpu-ci": (
        ("rmsnorm", {"R": 32, "H": 256}, "float32"),
        ("layernorm", {"R": 32, "H": 256}, "float32"),
        ("softmax", {"R": 32, "C": 500}, "float32"),
        ("swiglu", {"R": 32, "F": 512}, "float32"),
        ("rope", {"B": 1, "H": 4, "Hkv": 2, "S": 32, "D": 32}, "float32"),
        ("gemm", {"M": 64, "K": 128, "N": 96}, "float32"),
        ("attention_prefill", {"B": 1, "Hq": 4, "Hkv": 2, "S": 64, "D": 32}, "float32"),
        ("attention_decode", {"B": 2, "Hq": 4, "Hkv": 2, "L": 128, "D": 32}, "float32"),
        ("moe", {"T": 32, "H": 64, "F": 128, "E": 4}, "float32"),
        ("ssm_scan", {"B": 1, "D": 32, "N": 8, "L": 48}, "float32"),
    ),
    # Realistic CPU inference sizes (a 1B-class Llama: hidden 2048, MLP 8192, 32 heads of 64
    # with 8 KV heads; a small Mixtral-style MoE; Mamba-130m's d_inner 1536, d_state 16).
    "cpu": (
        ("rmsnorm", {"R": 512, "H": 2048}, "float32"),
        ("layernorm", {"R": 512, "H": 2048}, "float32"),
        ("softmax", {"R": 256, "C": 4096}, "float32"),
        ("swiglu", {"R": 256, "F": 8192}, "float32"),
        ("rope", {"B": 1, "H": 32, "Hkv": 8, "S": 256, "D": 64}, "float32"),
        ("gemm", {"M": 256, "K": 2048, "N": 2048}, "float32"),
        ("attention_prefill", {"B": 1, "Hq": 32, "Hkv": 8, "S": 256, "D": 64}, "float32"),
        ("attention_decode", {"B": 4, "Hq": 32, "Hkv": 8, "L": 1024, "D": 64}, "float32"),
        ("moe", {"T": 64, "H": 512, "F": 1408, "E": 8}, "float32"),
        ("ssm_scan", {"B": 1, "D": 1536, "N": 16, "L": 128}, "float32"),
    ),
    # Llama-3-8B (hidden 4096, MLP 14336, 32 query / 8 KV heads of 128, vocab 128256),
    # Mixtral-8x7B (8 experts, top-2) and Mamba-2.8B (d_inner 5120, d_state 16), in bf16,
    # at prefill (4096 tokens) and decode (batch 32) sizes.
    "gpu": (
        ("rmsnorm", {"R": 4096, "H": 4096}, "bfloat16"),
        ("rmsnorm", {"R": 32, "H": 4096}, "bfloat16"),
        ("layernorm", {"R": 4096, "H": 4096}, "bfloat16"),
        ("softmax", {"R": 4096, "C": 4096}, "bfloat16"),
        ("softmax", {"R": 32, "C": 128256}, "bfloat16"),
        ("swiglu", {"R": 4096, "F": 14336}, "bfloat16"),
        ("swiglu", {"R": 32, "F": 14336}, "bfloat16"),
        ("rope", {"B": 1, "H": 32, "Hkv": 8, "S": 4096, "D": 128}, "bfloat16"),
        ("gemm", {"M": 4096, "K": 4096, "N": 14336}, "bfloat16"),
        ("gemm", {"M": 4096, "K": 14336, "N": 4096}, "bfloat16"),
        ("gemm", {"M": 32, "K": 4096, "N": 6144}, "bfloat16"),
        ("attention_prefill", {"B": 1, "Hq": 32, "Hkv": 8, "S": 4096, "D": 128}, "bfloat16"),
        ("attention_decode", {"B": 32, "Hq": 32, "Hkv": 8, "L": 4096, "D": 128}, "bfloat16"),
        ("moe", {"T": 4096, "H": 4096, "F": 14336, "E": 8}, "bfloat16"),
        ("moe", {"T": 32, "H": 4096, "F": 14336, "E": 8}, "bfloat16"),
        ("ssm_scan", {"B": 1, "D": 5120, "N": 16, "L": 1024}, "bfloat16"),
    ),
}
_PROFILE_DEVICES = {"cpu-ci": "cpu", "cpu": "cpu", "gpu": "cuda"}


def _workload(name: str) -> _Workload:
    try:
        return _WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; suite v1 has {', '.join(workload_names())}") from None


def workload_names() -> list[str]:
    return list(_WORKLOADS)


def profile_names() -> list[str]:
    return list(_PROFILES)


def profile_device(profile: str) -> str:
    """The device type a profile is meant for: 'cpu' or 'cuda'."""
    _check_profile(profile)
    return _PROFILE_DEVICES[profile]


def _check_profile(profile: str) -> None:
    if profile not in _PROFILES:
        raise ValueError(f"unknown profile {profile!r}; use one of {', '.join(profile_names())}")


def profile_specs(profile: str) -> list[WorkloadSpec]:
    _check_profile(profile)
    return [
        WorkloadSpec(name=name, family=_workload(name).family, shape=dict(shape), dtype=dtype)
        for name, shape, dtype in _PROFILES[profile]
    ]


def input_layouts(spec: WorkloadSpec) -> list[InputLayout]:
    """The workload's inputs, in the order `kernel(*inputs)` takes them."""
    return _workload(spec.name).layouts(spec.shape)


def output_shapes(spec: WorkloadSpec) -> list[tuple[int, ...]]:
    """Shapes of the outputs; a single-tensor workload has one."""
    return _workload(spec.name).outputs(spec.shape)


def returns_tuple(spec: WorkloadSpec) -> bool:
    return len(output_shapes(spec)) > 1


def make_inputs(
    spec: WorkloadSpec, *, seed: int, device: str = "cpu", distribution: str = "normal"
) -> tuple[torch.Tensor, ...]:
    """Fresh inputs for one call, determined by (seed, device type, distribution)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; use one of {list(DISTRIBUTIONS)}")
    return tuple(
        generate_tensor(
            layout,
            layout.shape,
            seed=derive_seed(seed, spec.key, layout.seed_name, distribution),
            dtype=spec.torch_dtype,
            device=device,
            distribution=distribution,
        )
        for layout in input_layouts(spec)
    )


def baseline_fn(spec: WorkloadSpec) -> Callable[..., Any]:
    """The billed baseline: eager PyTorch with the library's standard op for this workload."""
    return _workload(spec.name).baseline


def baseline_impl(spec: WorkloadSpec) -> str:
    return _workload(spec.name).baseline_impl


def baseline_source(spec: WorkloadSpec) -> str:
    """A candidate module whose `kernel` is the baseline: used for A/A calibration runs."""
    function = _workload(spec.name).baseline.__name__
    return f"from runners.suite import {function} as kernel\n"


def reference(
    spec: WorkloadSpec, inputs: tuple[torch.Tensor, ...]
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The float64 result of the workload's math on `inputs`."""
    with torch.no_grad():
        return _workload(spec.name).reference(*inputs)


def check_mask(spec: WorkloadSpec, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, ...]:
    """Per output, which elements the comparison must hold for (None = all of them).

    Only MoE leaves anything out: tokens whose 2nd and 3rd router logits are within rounding
    distance of a tie, where either routing is a correct result in the spec's dtype.
    """
    if spec.name != "moe":
        return tuple(None for _ in output_shapes(spec))
    x, router = inputs[0].to(torch.float64), inputs[1].to(torch.float64)
    logits = torch.sort(x @ router, dim=-1, descending=True).values
    scale = logits.abs().amax(dim=-1).clamp_min(1e-30)
    gap = logits[:, MOE_TOP_K - 1] - logits[:, MOE_TOP_K]
    decided = gap > _ROUTING_TIE_GAP[spec.dtype] * scale
    return (decided[:, None].expand(x.shape[0], spec.shape["H"]),)


def tolerance(spec: WorkloadSpec) -> tuple[float, float]:
    """(atol, rtol) for the spec's dtype and workload; see the rule next to `_TOLERANCES`."""
    atol, rtol = _TOLERANCES[spec.dtype]
    scales = _LOW_PRECISION_ATOL_SCALE if spec.dtype != "float32" else _FLOAT32_ATOL_SCALE
    return atol * scales.get(spec.name, 1.0), rtol


def flops(spec: WorkloadSpec) -> int:
    return int(_workload(spec.name).flops(spec.shape))


def bytes_moved(spec: WorkloadSpec) -> int:
    """Compulsory memory traffic of one call: each input read once, each output written once."""
    return int(_workload(spec.name).elements_moved(spec.shape)) * _elsize(spec.dtype)


def find_spec(profile: str, workload: str) -> list[WorkloadSpec]:
    """All specs of `workload` in `profile` (a workload may appear at several shapes)."""
    _workload(workload)
    return [spec for spec in profile_specs(profile) if spec.name == workload]


def spec_for_key(profile: str, key: str) -> WorkloadSpec:
    """The spec a `WorkloadSpec.key` names (`rmsnorm[R=32,H=256]float32`) under `profile`'s
    protocol: the profile's template of that workload at the key's shape and dtype (what a model
    run audits at its own shapes). ValueError, saying what is wrong, for anything else."""
    match = re.fullmatch(r"([a-z_0-9]+)\[([A-Za-z_0-9=,]*)\]([a-z0-9]+)", key)
    if match is None:
        raise ValueError(f"{key!r} is not a workload key such as 'rmsnorm[R=32,H=256]float32'")
    name, dims, dtype = match.groups()
    if name not in workload_names():
        raise ValueError(f"{key!r}: unknown workload {name!r}")
    if dtype not in DTYPES:
        raise ValueError(f"{key!r}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    templates = find_spec(profile, name)
    if not templates:
        raise ValueError(f"{key!r}: profile {profile!r} has no {name} workload")
    shape = {}
    for part in filter(None, dims.split(",")):
        dim, _, value = part.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{key!r}: dimension {part!r} is not NAME=POSITIVE_INTEGER")
        shape[dim] = int(value)
    if set(shape) != set(templates[0].shape):
        raise ValueError(f"{key!r}: shape keys {sorted(shape)} are not {name}'s {sorted(templates[0].shape)}")
    return dataclasses.replace(templates[0], shape={k: shape[k] for k in templates[0].shape}, dtype=dtype)


def manifest(profile: str, *, protocol: Any = None, specs: list[WorkloadSpec] | None = None) -> dict[str, Any]:
    """Everything that defines a result for `profile`, as canonical-JSON-ready data.

    `protocol` (a runners.measure.Protocol) defaults to the profile's own; `specs` replaces the
    profile's shapes when a run audits others (a model's own GEMM and attention shapes).
    """
    from runners import checks, measure  # late: both import this module

    specs = profile_specs(profile) if specs is None else list(specs)
    names = sorted({spec.name for spec in specs})
    return {
        "suite": "dyno-suite",
        "version": SUITE_VERSION,
        "profile": profile,
        "device": profile_device(profile),
        "workloads": [
            {
                "spec": spec.to_dict(),
                "tolerance": list(tolerance(spec)),
                "inputs": [layout.to_dict() for layout in input_layouts(spec)],
                "outputs": [list(shape) for shape in output_shapes(spec)],
                "flops": flops(spec),
                "bytes_moved": bytes_moved(spec),
            }
            for spec in specs
        ],
        "constants": {
            "eps": EPS,
            "moe_top_k": MOE_TOP_K,
            "distributions": list(DISTRIBUTIONS),
            "routing_tie_gap": _ROUTING_TIE_GAP,
            "low_precision_atol_scale": _LOW_PRECISION_ATOL_SCALE,
        },
        "sources": {
            "baselines": {n: inspect.getsource(_WORKLOADS[n].baseline) for n in names},
            "references": {n: inspect.getsource(_WORKLOADS[n].reference) for n in names},
            "generators": [
                inspect.getsource(fn)
                for fn in (_sample_distribution, _rope_table, generate_tensor, derive_seed, make_inputs, check_mask)
            ],
            "comparison": inspect.getsource(checks.compare_tensors),
        },
        "protocol": (protocol or measure.protocol_for(profile)).to_dict(),
    }


def manifest_sha256(profile: str, *, protocol: Any = None, specs: list[WorkloadSpec] | None = None) -> str:
    text = json.dumps(manifest(profile, protocol=protocol, specs=specs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
