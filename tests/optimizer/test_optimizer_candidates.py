"""Candidate sources: every family's CPU and GPU candidates compute the suite's math (checked with
the runner's own inputs, references and comparison rule), and a source pins its parameters."""

from __future__ import annotations

import pytest
import torch

import runners.suite as suite
from optimizer.candidates import (
    FAMILIES,
    Variant,
    candidate_space,
    family_constants,
    load_kernel,
    render_candidate,
)
from runners.checks import compare_tensors

# Small odd shapes per family (cpu-ci's, shrunk further where the interpreter is slow).
SMALL: dict[str, dict[str, int]] = {
    "rmsnorm": {"R": 7, "H": 100},
    "layernorm": {"R": 7, "H": 100},
    "softmax": {"R": 5, "C": 77},
    "swiglu": {"R": 5, "F": 66},
    "rope": {"B": 1, "H": 4, "Hkv": 2, "S": 9, "D": 16},
    "gemm": {"M": 19, "K": 24, "N": 21},
    "attention_prefill": {"B": 1, "Hq": 4, "Hkv": 2, "S": 13, "D": 16},
    "attention_decode": {"B": 2, "Hq": 4, "Hkv": 2, "L": 37, "D": 16},
    "moe": {"T": 11, "H": 16, "F": 24, "E": 4},
    "ssm_scan": {"B": 2, "D": 6, "N": 4, "L": 21},
}


def check(family: str, kernel, dtype: str = "float32") -> None:
    spec = suite.WorkloadSpec(family, "x", SMALL[family], dtype)
    atol, rtol = suite.tolerance(spec)
    for i, dist in enumerate(suite.DISTRIBUTIONS):
        inputs = suite.make_inputs(spec, seed=i, distribution=dist)
        out = kernel(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        refs = suite.reference(spec, inputs)
        refs = refs if isinstance(refs, tuple) else (refs,)
        for o, r, m in zip(outs, refs, suite.check_mask(spec, inputs), strict=True):
            c = compare_tensors(o, r, atol=atol, rtol=rtol, mask=m)
            assert c.passed, f"{family} on {dist} inputs: max abs err {c.max_abs_err:.3g}, ratio {c.worst_ratio:.3g}"
            assert o.dtype == spec.torch_dtype


@pytest.mark.parametrize("family", FAMILIES)
def test_it_computes_the_suite_math_with_every_eager_cpu_candidate(family):
    space = candidate_space(family, family, SMALL[family], "float32", "cpu")
    assert space[0].name == "baseline"
    eager = [c for c in space if not c.params["variant"].startswith("compile-")]
    assert eager
    for c in eager:
        check(family, load_kernel(c.source, c.name))


@pytest.mark.parametrize("family,name", [("ssm_scan", "compile-chunked"), ("rope", "compile-halves")])
def test_it_computes_the_suite_math_with_compiled_cpu_candidates(family, name):
    params = {"mode": "default", **({"chunk": 8} if family == "ssm_scan" else {})}
    c = render_candidate(family, family, Variant(name, params), constants=family_constants(family, SMALL[family]))
    check(family, load_kernel(c.source, c.name))


def _smallest_triton(family: str):
    gpu = [c for c in candidate_space(family, family, SMALL[family], "float32", "cuda") if c.params["variant"] == "triton"]
    assert gpu, f"{family} has no Triton candidates"
    size = lambda c: sum(v for k, v in c.params.items() if k.startswith("block") and isinstance(v, int))  # noqa: E731
    return min(gpu, key=size)


@pytest.mark.parametrize("family", FAMILIES)
def test_it_computes_the_suite_math_with_triton_candidates_under_the_interpreter(family):
    c = _smallest_triton(family)
    check(family, load_kernel(c.source, c.name))


def test_it_runs_triton_candidates_in_bfloat16():
    for family in ("rmsnorm", "attention_decode"):
        c = _smallest_triton(family)
        check(family, load_kernel(c.source, c.name), dtype="bfloat16")


def test_it_pins_parameters_and_constants_in_the_source():
    a = render_candidate("rmsnorm", "rmsnorm", Variant("triton", {"block_size": 256, "num_warps": 4}))
    b = render_candidate("rmsnorm", "rmsnorm", Variant("triton", {"block_size": 512, "num_warps": 4}))
    assert "block_size=256" in a.source and "block_size=512" in b.source
    assert a.source_sha256 != b.source_sha256
    model_eps = render_candidate("rmsnorm", "rmsnorm", Variant("baseline"),
                                 constants=family_constants("rmsnorm", {}, {"EPS": 1e-5}))
    assert "EPS = 1e-05" in model_eps.source
    with pytest.raises(ValueError, match="take constants"):
        family_constants("rmsnorm", {}, {"TOP_K": 3})
    with pytest.raises(ValueError, match="unknown variant"):
        render_candidate("rmsnorm", "rmsnorm", Variant("hand-written"))


def test_it_scopes_a_candidates_thread_count_to_its_own_calls():
    c = render_candidate("softmax", "softmax", Variant("baseline", {"threads": 1}))
    kernel = load_kernel(c.source)
    before = torch.get_num_threads()
    seen: list[int] = []
    original = torch.softmax
    try:
        torch.softmax = lambda *a, **k: (seen.append(torch.get_num_threads()), original(*a, **k))[1]  # type: ignore[assignment]
        kernel(torch.randn(3, 5))
    finally:
        torch.softmax = original  # type: ignore[assignment]
    assert seen == [1] and torch.get_num_threads() == before
