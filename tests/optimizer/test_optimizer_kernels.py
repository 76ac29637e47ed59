"""Triton kernels of every family against float64 references, through Triton's CPU interpreter
(or compiled for real on a GPU: DYNO_KERNEL_TEST_DEVICE=cuda, as benchmarks/gpu_check.py runs them).

Shapes are small and odd (not multiples of any block) so the masking paths are exercised; block
sizes are forced small so multi-block loops and the split/chunk paths run too.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.optimizer import opt_reference as ref
from optimizer.kernels.add_rmsnorm import add_rmsnorm_triton
from optimizer.kernels.attention_decode import attention_decode_triton
from optimizer.kernels.attention_prefill import attention_prefill_triton
from optimizer.kernels.gate_up_swiglu import gate_up_swiglu_triton
from optimizer.kernels.gemm import gemm_triton
from optimizer.kernels.layernorm import layernorm_triton
from optimizer.kernels.moe import moe_triton, route_topk
from optimizer.kernels.qkv_rope import qkv_rope_triton
from optimizer.kernels.rmsnorm import rmsnorm_triton
from optimizer.kernels.rope import rope_triton
from optimizer.kernels.softmax import softmax_triton
from optimizer.kernels.ssm_scan import ssm_scan_triton
from optimizer.kernels.swiglu import swiglu_triton

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICE = os.environ.get("DYNO_KERNEL_TEST_DEVICE", "cpu")


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols,block", [(7, 37, None), (5, 100, 32)])
def test_it_normalizes_rms_like_the_reference(dtype, rows, cols, block):
    x, w = randn(rows, cols, dtype=dtype, seed=1), randn(cols, dtype=dtype, seed=2)
    y = rmsnorm_triton(x, w, 1e-6, block_size=block, rows_per_program=2)
    ref.assert_close(y, ref.rmsnorm(x, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [None, 16])
def test_it_fuses_the_residual_add_into_rmsnorm(dtype, block):
    x, r, w = randn(3, 2, 37, dtype=dtype, seed=1), randn(3, 2, 37, dtype=dtype, seed=3), randn(37, dtype=dtype, seed=2)
    y, h = add_rmsnorm_triton(x, r, w, 1e-6, block_size=block)
    if dtype == torch.bfloat16:
        # The interpreter truncates float32 -> bfloat16 where a GPU rounds to nearest: one ulp.
        torch.testing.assert_close(h, x + r, atol=0.0, rtol=2.0**-7)
    else:
        assert torch.equal(h, x + r), "the new residual must be exactly the dtype-rounded sum"
    ref.assert_close(y, ref.rmsnorm(h, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [None, 32])
def test_it_layer_normalizes_rows_with_a_large_mean(dtype, block):
    x = randn(6, 77, dtype=dtype, seed=1) + 3.0
    w, b = randn(77, dtype=dtype, seed=2), randn(77, dtype=dtype, seed=3)
    y = layernorm_triton(x, w, b, 1e-6, block_size=block, rows_per_program=4)
    ref.assert_close(y, ref.layernorm(x, w, b), dtype, scale=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [None, 16])
def test_it_softmaxes_wide_rows_online(dtype, block):
    x = randn(5, 53, dtype=dtype, seed=4, scale=4.0)
    x[0, :20] = -float("inf")  # a row whose first blocks are all masked out
    y = softmax_triton(x, block_size=block, rows_per_program=3)
    ref.assert_close(y, ref.softmax(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_it_computes_swiglu_across_ragged_blocks(dtype):
    g, u = randn(9, 67, dtype=dtype, seed=5, scale=3.0), randn(9, 67, dtype=dtype, seed=6)
    ref.assert_close(swiglu_triton(g, u, block_size=128, num_warps=2), ref.swiglu(g, u), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_it_rotates_q_and_k_with_rope(dtype):
    b, hq, hkv, s, d = 2, 3, 1, 11, 12
    q, k = randn(b, hq, s, d, dtype=dtype, seed=7), randn(b, hkv, s, d, dtype=dtype, seed=8)
    cos, sin = (t.to(dtype=dtype, device=DEVICE) for t in ref.rope_tables(s, d))
    rq, rk = rope_triton(q, k, cos, sin, block_rows=8)
    ref.assert_close(rq, ref.rope_one(q, cos, sin), dtype)
    ref.assert_close(rk, ref.rope_one(k, cos, sin), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k,persistent", [(1, None), (3, None), (1, 2)])
def test_it_multiplies_matrices_with_split_k_and_persistent_tiles(dtype, split_k, persistent):
    a, b = randn(37, 45, dtype=dtype, seed=9), randn(45, 29, dtype=dtype, seed=10)
    c = gemm_triton(a, b, block_m=16, block_n=16, block_k=16, group_m=2, num_warps=2, num_stages=1,
                    split_k=split_k, persistent_programs=persistent)
    ref.assert_close(c, a.double() @ b.double(), dtype, scale=8.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_it_fuses_gate_up_projection_with_swiglu(dtype):
    x = randn(2, 9, 40, dtype=dtype, seed=11)
    w = randn(80, 40, dtype=dtype, seed=12, scale=0.2)  # [2F, K] like a Linear weight
    w_gate, w_up = w[:40].t(), w[40:].t()  # strided [K, F] views, no copy
    y = gate_up_swiglu_triton(x, w_gate, w_up, block_m=16, block_n=16, block_k=16, num_warps=2, num_stages=1)
    g = x.double() @ w_gate.double()
    u = x.double() @ w_up.double()
    ref.assert_close(y, ref.swiglu(g, u), dtype, scale=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_it_projects_qkv_and_rotates_in_one_kernel(dtype):
    b, s, k, hq, hkv, d = 2, 7, 24, 4, 2, 6
    x = randn(b, s, k, dtype=dtype, seed=13)
    w = randn(k, (hq + 2 * hkv) * d, dtype=dtype, seed=14, scale=0.3)
    cos, sin = (t.to(dtype=dtype, device=DEVICE) for t in ref.rope_tables(s, d))
    q, kk, v = qkv_rope_triton(x, w, cos, sin, n_q_heads=hq, n_kv_heads=hkv, block_m=8, block_k=16,
                               num_warps=2, num_stages=1)
    proj = (x.double() @ w.double()).view(b, s, hq + 2 * hkv, d).transpose(1, 2)
    ref.assert_close(q, ref.rope_one(proj[:, :hq], cos, sin), dtype, scale=2.0)
    ref.assert_close(kk, ref.rope_one(proj[:, hq:hq + hkv], cos, sin), dtype, scale=2.0)
    ref.assert_close(v, proj[:, hq + hkv:], dtype, scale=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_it_attends_causally_with_grouped_kv_heads(dtype, causal):
    b, hq, hkv, s, d = 1, 4, 2, 21, 12
    q, k, v = (randn(b, h, s, d, dtype=dtype, seed=15 + i) for i, h in enumerate((hq, hkv, hkv)))
    o = attention_prefill_triton(q, k, v, causal=causal, block_m=16, block_n=16, num_warps=2, num_stages=1)
    ref.assert_close(o, ref.attention(q, k, v, causal=causal), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 3, 16])
def test_it_decodes_over_a_split_kv_cache(dtype, splits):
    b, hq, hkv, length, d = 2, 6, 2, 45, 10
    q = randn(b, hq, 1, d, dtype=dtype, seed=20)
    k, v = randn(b, hkv, length, d, dtype=dtype, seed=21), randn(b, hkv, length, d, dtype=dtype, seed=22)
    o = attention_decode_triton(q, k, v, num_splits=splits, block_n=16, num_warps=2, num_stages=1)
    ref.assert_close(o, ref.attention(q, k, v, causal=False), dtype)


def test_it_routes_each_token_to_its_top_two_experts():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.0, 0.0], [3.0, 3.0, 0.0, -2.0, 1.0]], device=DEVICE)
    ids, weights = route_topk(logits, 2)
    assert ids.tolist() == [[1, 3], [0, 1]]  # the tie goes to the lower index
    p = torch.softmax(logits.double(), -1)
    expected = torch.stack([p[0, [1, 3]], p[1, [0, 1]]])
    torch.testing.assert_close(weights.double(), expected / expected.sum(-1, keepdim=True), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_it_runs_grouped_expert_gemms_for_top2_moe(dtype):
    t, h, f, e = 13, 24, 20, 5
    x = randn(t, h, dtype=dtype, seed=30)
    router = randn(h, e, dtype=dtype, seed=31)
    w_gate, w_up = randn(e, h, f, dtype=dtype, seed=32, scale=0.3), randn(e, h, f, dtype=dtype, seed=33, scale=0.3)
    w_down = randn(e, f, h, dtype=dtype, seed=34, scale=0.3)
    out = moe_triton(x, router, w_gate, w_up, w_down, block_m=4, block_n=16, block_k=16, num_warps=2, num_stages=1)
    ref.assert_close(out, ref.moe(x, router, w_gate, w_up, w_down), dtype, scale=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk,softplus", [(64, False), (5, True)])
def test_it_scans_selectively_in_chunks(dtype, chunk, softplus):
    b, d_model, n, length = 2, 11, 5, 23
    u = randn(b, d_model, length, dtype=dtype, seed=40)
    delta = randn(b, d_model, length, dtype=torch.float64, seed=41, scale=0.5)
    delta = (delta if softplus else delta.abs() * 0.3).to(dtype)
    A = (-torch.rand(d_model, n, generator=torch.Generator().manual_seed(42), dtype=torch.float64) * 2).to(dtype=dtype, device=DEVICE)
    B, C = randn(b, n, length, dtype=dtype, seed=43), randn(b, n, length, dtype=dtype, seed=44)
    D = randn(d_model, dtype=dtype, seed=45)
    y = ssm_scan_triton(u, delta, A, B, C, D, delta_softplus=softplus, block_d=4, chunk=chunk, num_warps=2)
    ref.assert_close(y, ref.ssm_scan(u, delta, A, B, C, D, softplus=softplus), dtype, scale=2.0)


def test_it_reads_strided_expert_weights_in_place():
    t, h, f, e = 9, 16, 12, 3
    x, router = randn(t, h, dtype=torch.float32, seed=50), randn(h, e, dtype=torch.float32, seed=51)
    gate_up = randn(e, 2 * f, h, dtype=torch.float32, seed=52, scale=0.3)  # Mixtral's [E, 2F, H] parameter
    down = randn(e, h, f, dtype=torch.float32, seed=53, scale=0.3)  # [E, H, F]
    w_gate, w_up, w_down = gate_up[:, :f].transpose(1, 2), gate_up[:, f:].transpose(1, 2), down.transpose(1, 2)
    out = moe_triton(x, router, w_gate, w_up, w_down, block_m=4, block_n=16, block_k=16, num_warps=2, num_stages=1)
    ref.assert_close(out, ref.moe(x, router, w_gate, w_up, w_down), torch.float32)


@pytest.mark.parametrize("launch", ["prefill", "decode", "gemm"])
def test_it_refuses_a_matrix_product_block_smaller_than_the_gpu_compiles(launch):
    """Triton compiles no tl.dot with an inner dimension under 16 for NVIDIA GPUs; the interpreter
    would run one, so the launcher says so before a GPU ever sees it."""
    q = randn(1, 2, 20, 16, dtype=torch.float32, seed=1)
    with pytest.raises(ValueError, match="at least 16"):
        if launch == "prefill":
            attention_prefill_triton(q, q, q, block_n=8)
        elif launch == "decode":
            attention_decode_triton(q[:, :, :1], q, q, block_n=8)
        else:
            gemm_triton(q[0, 0], q[0, 0].T.contiguous(), block_k=8)
