"""What candidates exist for a suite workload on a device, and the module source of each.

A candidate's source defines `kernel(*inputs)` in the suite's input order, imports its
implementation from `optimizer.kernels.<family>`, and spells every tuning parameter out as a
literal, so the source hash alone pins the configuration that was measured.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from optimizer.evaluation import Candidate

FAMILIES: tuple[str, ...] = (
    "rmsnorm", "layernorm", "softmax", "swiglu", "rope", "gemm",
    "attention_prefill", "attention_decode", "moe", "ssm_scan",
)

# H100/H200 SM count, for persistent GEMM grids; the search also tries non-persistent launches.
_GPU_SMS = 132


@dataclass(frozen=True)
class Variant:
    """One point of a family's search space: an implementation name and its parameters.

    `prior` orders evaluation (lower first) so that a search cut short by its time budget has
    already measured the likeliest winners; it comes from the measurements in the family's notes.
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    prior: int = 50

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        inner = ",".join(f"{k}={_short(v)}" for k, v in sorted(self.params.items()))
        return f"{self.name}[{inner}]"


def _short(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, dict) else str(value)


@dataclass(frozen=True)
class _Family:
    """How to write a candidate for one family. Expressions may use the input names in `args`,
    `_ops` (the family's kernel module) and the UPPER_CASE constants."""

    args: str
    module: str
    baseline: str
    constants: dict[str, Any]
    # name -> call expression of an eager torch formulation (run as is, or under a thread count)
    eager: dict[str, str]
    # name -> (function compiled as `_fn`, call expression using `_fn`)
    compiled: dict[str, tuple[str, str]]
    # call expression of the Triton launcher; `{kw}` receives the variant's parameters
    triton: str
    baseline_imports: str = ""


_ROTATE_HALF = "torch.cat((-{x}[..., {x}.shape[-1] // 2:], {x}[..., :{x}.shape[-1] // 2]), dim=-1)"

_SPECS: dict[str, _Family] = {
    "rmsnorm": _Family(
        args="x, weight",
        module="rmsnorm",
        baseline="F.rms_norm(x, (x.shape[-1],), weight, EPS)",
        constants={"EPS": 1e-6},
        eager={},
        compiled={"fused": ("_ops.rmsnorm_torch", "_fn(x, weight, EPS)")},
        triton="_ops.rmsnorm_triton(x, weight, EPS, {kw})",
    ),
    "layernorm": _Family(
        args="x, weight, bias",
        module="layernorm",
        baseline="F.layer_norm(x, (x.shape[-1],), weight, bias, EPS)",
        constants={"EPS": 1e-6},
        eager={},
        compiled={"fused": ("_ops.layernorm_torch", "_fn(x, weight, bias, EPS)")},
        triton="_ops.layernorm_triton(x, weight, bias, EPS, {kw})",
    ),
    "softmax": _Family(
        args="x",
        module="softmax",
        baseline="torch.softmax(x, dim=-1)",
        constants={},
        eager={},
        compiled={"fused": ("_ops.softmax_torch", "_fn(x)")},
        triton="_ops.softmax_triton(x, {kw})",
    ),
    "swiglu": _Family(
        args="gate, up",
        module="swiglu",
        baseline="F.silu(gate) * up",
        constants={},
        eager={},
        compiled={"fused": ("_ops.swiglu_torch", "_fn(gate, up)")},
        triton="_ops.swiglu_triton(gate, up, {kw})",
    ),
    "rope": _Family(
        args="q, k, cos, sin",
        module="rope",
        baseline=(f"(q * cos + {_ROTATE_HALF.format(x='q')} * sin, "
                  f"k * cos + {_ROTATE_HALF.format(x='k')} * sin)"),
        constants={},
        eager={"halves": "_ops.rope_torch_native(q, k, cos, sin)"},
        compiled={
            "halves-f32": ("_ops.rope_torch", "_fn(q, k, cos, sin)"),
            "halves": ("_ops.rope_torch_native", "_fn(q, k, cos, sin)"),
        },
        triton="_ops.rope_triton(q, k, cos, sin, {kw})",
    ),
    "gemm": _Family(
        args="a, b",
        module="gemm",
        baseline="torch.matmul(a, b)",
        constants={},
        eager={},
        compiled={"matmul": ("torch.matmul", "_fn(a, b)")},
        triton="_ops.gemm_triton(a, b, {kw})",
    ),
    "attention_prefill": _Family(
        args="q, k, v",
        module="attention_prefill",
        baseline="F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)",
        constants={},
        eager={"folded": "_ops.attention_prefill_folded(q, k, v)"},
        compiled={},
        triton="_ops.attention_prefill_triton(q, k, v, causal=True, {kw})",
    ),
    "attention_decode": _Family(
        args="q, k_cache, v_cache",
        module="attention_decode",
        baseline="F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)",
        constants={},
        eager={"folded": "_ops.attention_decode_folded(q, k_cache, v_cache)"},
        compiled={"matmul": ("_ops.attention_decode_matmul", "_fn(q, k_cache, v_cache)")},
        triton="_ops.attention_decode_triton(q, k_cache, v_cache, {kw})",
    ),
    "moe": _Family(
        args="x, router, w_gate, w_up, w_down",
        module="moe",
        baseline="_ops.moe_eager(x, router, w_gate, w_up, w_down, top_k=TOP_K, renormalize=RENORMALIZE)",
        constants={"TOP_K": 2, "RENORMALIZE": True},
        eager={
            "sorted": "_ops.moe_sorted(x, router, w_gate, w_up, w_down, top_k=TOP_K, renormalize=RENORMALIZE)",
            "padded-bmm": "_ops.moe_padded_bmm(x, router, w_gate, w_up, w_down, top_k=TOP_K, renormalize=RENORMALIZE)",
        },
        compiled={},
        triton="_ops.moe_triton(x, router, w_gate, w_up, w_down, top_k=TOP_K, renormalize=RENORMALIZE, {kw})",
    ),
    "ssm_scan": _Family(
        args="u, delta, A, B, C, D",
        module="ssm_scan",
        baseline="_ops.ssm_scan_eager(u, delta, A, B, C, D, delta_softplus=DELTA_SOFTPLUS)",
        constants={"DELTA_SOFTPLUS": False},
        eager={"hoisted-loop": "_ops.ssm_scan_loop(u, delta, A, B, C, D, delta_softplus=DELTA_SOFTPLUS)"},
        compiled={
            "chunked": ("_ops.ssm_chunk_step",
                        "_ops.ssm_scan_chunked(u, delta, A, B, C, D, chunk=CHUNK, delta_softplus=DELTA_SOFTPLUS, step=_fn)"),
        },
        triton="_ops.ssm_scan_triton(u, delta, A, B, C, D, delta_softplus=DELTA_SOFTPLUS, {kw})",
    ),
}


def resolve_family(spec_name: str, family: str) -> str:
    """The kernel family of a workload. The suite groups workloads into categories
    ("normalization", "attention", ...) while kernels are per workload, so a category resolves
    through the workload's name (or the name's prefix, e.g. "rmsnorm-prefill")."""
    if family in _SPECS:
        return family
    for candidate in (spec_name, spec_name.split("[")[0], spec_name.split("-")[0], spec_name.split(":")[0]):
        if candidate in _SPECS:
            return candidate
    raise ValueError(f"no kernel family for workload {spec_name!r} (family {family!r}); known: {', '.join(FAMILIES)}")


def is_gpu(device: str) -> bool:
    return device == "gpu" or device.startswith("cuda")


def family_constants(family: str, shape: dict[str, int], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The constants a candidate bakes in (eps, top-k, ...): family defaults, the shape's top-k
    for MoE, then explicit overrides (a model's own eps, say)."""
    spec = _spec(family)
    constants = dict(spec.constants)
    if family == "moe" and "topk" in shape:
        constants["TOP_K"] = int(shape["topk"])
    for key, value in (overrides or {}).items():
        if key not in constants:
            raise ValueError(f"{family} candidates take constants {sorted(constants)}, not {key!r}")
        constants[key] = value
    return constants


def _spec(family: str) -> _Family:
    try:
        return _SPECS[family]
    except KeyError:
        raise ValueError(f"unknown workload family {family!r}; known: {', '.join(FAMILIES)}") from None


# Shape keys per family (the runner's inventory and suite use the same names).
SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("R", "H"),
    "layernorm": ("R", "H"),
    "softmax": ("R", "C"),
    "swiglu": ("R", "F"),
    "rope": ("B", "H", "Hkv", "S", "D"),
    "gemm": ("M", "K", "N"),
    "attention_prefill": ("B", "Hq", "Hkv", "S", "D"),
    "attention_decode": ("B", "Hq", "Hkv", "L", "D"),
    "moe": ("T", "H", "F", "E", "topk"),
    "ssm_scan": ("B", "D", "L", "N"),
}


def check_shape(family: str, shape: dict[str, int]) -> None:
    """Raise, naming what is missing, unless `shape` has every dimension of `family` (MoE's top-k
    may be left to the default of 2)."""
    keys = SHAPE_KEYS.get(family)
    if keys is None:
        raise ValueError(f"unknown workload family {family!r}; known: {', '.join(SHAPE_KEYS)}")
    missing = [k for k in keys if k not in shape and not (family == "moe" and k == "topk")]
    if missing:
        raise ValueError(f"{family} shape {shape} lacks {missing}; it needs {list(keys)}")


# -- search spaces -------------------------------------------------------------------------------


# CPU search order per family, fastest first as measured on the 2-core development box (Xeon,
# AVX-512; interleaved in-process timings of the `cpu` profile shapes, November 2025; see
# benchmarks/optimizer_cpu.py). A budget-limited search measures the head of each list, and a
# torch.compile candidate costs ~40 s in the runner's sandbox (cold inductor cache per worker),
# so the order matters. Items: variant name, then "@1" for one intra-op thread, "+ma" for
# inductor's max-autotune, ":N" for the scan's chunk length.
_CPU_ORDER: dict[str, tuple[str, ...]] = {
    # compile fuses the five eager passes of F.rms_norm into one
    "rmsnorm": ("compile-fused", "compile-fused@1", "baseline@1"),
    # ATen's fused kernels beat inductor's at these sizes: only thread counts are worth trying
    "layernorm": ("baseline@1", "compile-fused"),
    "softmax": ("baseline@1", "compile-fused"),
    "swiglu": ("compile-fused", "compile-fused@1", "baseline@1"),
    # the half-split form avoids rotate_half's cat and negation copies
    "rope": ("compile-halves", "compile-halves-f32", "eager-halves", "compile-halves@1", "baseline@1"),
    # oneDNN/MKL GEMM is at the machine's peak; threads and inductor's C++ GEMM template are all
    # there is to try
    "gemm": ("baseline@1", "compile-matmul+ma", "compile-matmul+ma@1"),
    "attention_prefill": ("eager-folded", "baseline@1", "eager-folded@1"),
    # folding the query group reads each KV row once per group instead of once per head
    "attention_decode": ("eager-folded", "compile-matmul", "eager-folded@1", "compile-matmul+ma", "baseline@1"),
    # one batched GEMM per projection instead of one per expert
    "moe": ("eager-padded-bmm", "eager-sorted", "eager-padded-bmm@1", "baseline@1"),
    # the unrolled chunk compiles to one vectorized loop nest per chunk
    "ssm_scan": ("compile-chunked:32", "compile-chunked:64", "compile-chunked:16", "compile-chunked:32@1",
                 "eager-hoisted-loop"),
}


# The least a torch.compile'd call costs on CPU whatever it computes (dynamo's guard check,
# inductor's wrapper, allocating the output): the compiled 8x64 rmsnorm took 40 us in process, and
# the torch-compile reference point of every `cpu-ci` workload 53-530 us in the runner's sandbox,
# on the 2-core development box (Xeon, torch 2.13, November 2026). A workload whose baseline is
# already faster cannot gain from compiling, and a compile costs ~45 s of a search's budget in a
# cold sandbox: the search skips such candidates without building them.
CPU_COMPILED_CALL_FLOOR_S = 40e-6


def call_floor_s(candidate: Candidate, device: str) -> float:
    """The least one call of `candidate` can take on `device` at any shape; 0 when unknown."""
    if not is_gpu(device) and str(candidate.params.get("variant", "")).startswith("compile-"):
        return CPU_COMPILED_CALL_FLOOR_S
    return 0.0


def _parse_order_item(item: str) -> Variant:
    params: dict[str, Any] = {}
    if item.endswith("@1"):
        item, params["threads"] = item[:-2], 1
    if ":" in item:
        item, chunk = item.split(":")
        params["chunk"] = int(chunk)
    if item.endswith("+ma"):
        item, params["mode"] = item[:-3], "max-autotune-no-cudagraphs"
    elif item.startswith("compile-"):
        params["mode"] = "default"
    return Variant(item, params)


def _cpu_variants(family: str, shape: dict[str, int]) -> list[Variant]:
    """CPU: the baseline, then the family's measured order (see _CPU_ORDER)."""
    del shape  # the order was measured at the cpu profile's shapes; the search re-measures anyway
    out = [Variant("baseline", {}, prior=0)]
    for rank, item in enumerate(_CPU_ORDER[family], start=1):
        v = _parse_order_item(item)
        out.append(Variant(v.name, v.params, prior=rank))
    return out


def _gpu_triton_params(family: str, shape: dict[str, int]) -> list[dict[str, Any]]:
    """Triton launch configurations per family. The grids are the ones the Triton tutorials and
    vLLM/flash-decoding ship as defaults and their neighbours; none was measured in this repo yet
    (no GPU during development), so the search, not these lists, decides."""
    if family in ("rmsnorm", "layernorm", "softmax"):
        width = shape.get("H", shape.get("C", 4096))
        full = 1 << max(0, (width - 1).bit_length())
        blocks = sorted({min(full, 16384), min(full, 4096), min(full, 1024)}, reverse=True)
        return [{"block_size": b, "num_warps": w, "rows_per_program": r}
                for b, w, r in itertools.product(blocks, (2, 4, 8, 16), (1, 4)) if w * 32 <= max(b, 64)]
    if family == "swiglu":
        return [{"block_size": b, "num_warps": w} for b, w in itertools.product((1024, 2048, 4096), (4, 8))]
    if family == "rope":
        return [{"block_rows": b, "num_warps": w} for b, w in itertools.product((4, 16, 64), (2, 4, 8))]
    if family == "gemm":
        tiles = [(128, 256, 64, 8, 3), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
                 (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 2, 5), (128, 128, 64, 8, 3)]
        out = [{"block_m": m, "block_n": n, "block_k": k, "num_warps": w, "num_stages": s, "group_m": 8}
               for m, n, k, w, s in tiles]
        out += [{**out[-1], "persistent_programs": _GPU_SMS}]
        small_mn = shape.get("M", 1) * shape.get("N", 1) <= 256 * 256 and shape.get("K", 0) >= 4096
        if small_mn:
            out += [{**out[2], "split_k": s} for s in (2, 4, 8)]
        return out
    if family == "attention_prefill":
        return [{"block_m": m, "block_n": n, "num_warps": w, "num_stages": s}
                for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))]
    if family == "attention_decode":
        length = shape.get("L", 4096)
        splits = sorted({1, 4, 16, 64, max(1, length // 512)})
        return [{"num_splits": s, "block_n": n, "num_warps": w}
                for s, n, w in itertools.product(splits, (32, 64, 128), (2, 4))]
    if family == "moe":
        return [{"block_m": m, "block_n": n, "block_k": k, "num_warps": w}
                for m, n, k, w in itertools.product((16, 32, 64), (64, 128), (64, 128), (4, 8))]
    if family == "ssm_scan":
        length = shape.get("L", 2048)
        chunks = sorted({length, 512, 256, 128})
        return [{"block_d": d, "chunk": c, "num_warps": w}
                for d, c, w in itertools.product((16, 32, 64), chunks, (2, 4))]
    raise ValueError(f"unknown workload family {family!r}")


def _gpu_variants(family: str, shape: dict[str, int]) -> list[Variant]:
    spec = _SPECS[family]
    out = [Variant("baseline", {}, prior=0)]
    out += [Variant("triton", p, prior=5 + i) for i, p in enumerate(_gpu_triton_params(family, shape))]
    for name in spec.compiled:
        extra = [{"chunk": 64}] if family == "ssm_scan" else [{}]
        for more in extra:
            out.append(Variant(f"compile-{name}", {"mode": "max-autotune-no-cudagraphs", **more}, prior=3))
    return out


def variants(family: str, shape: dict[str, int], device: str) -> list[Variant]:
    """The search space of `family` at `shape` on `device`, baseline first, then by prior."""
    _spec(family)
    found = _gpu_variants(family, shape) if is_gpu(device) else _cpu_variants(family, shape)
    return sorted(found, key=lambda v: v.prior)


# -- rendering -----------------------------------------------------------------------------------


def _inductor_options(mode: str, threads: int | None) -> dict[str, Any]:
    """torch.compile takes a mode or options, not both: the mode is expanded to its options so
    a thread count can ride along (inductor bakes the OpenMP thread count into the C++ it
    writes, and keys its caches on these options, so a one-thread build is never reused as a
    two-thread one)."""
    import torch._inductor

    options = dict(torch._inductor.list_mode_options(mode))
    if threads:
        options["cpp.threads"] = threads
    return options


def render_source(
    family: str, variant: Variant, *, constants: dict[str, Any] | None = None, workload: str | None = None
) -> str:
    """The candidate module text of `variant` (see the module docstring)."""
    spec = _spec(family)
    consts = dict(spec.constants) if constants is None else constants
    params = dict(variant.params)
    threads = params.pop("threads", None)
    # A thread scope costs ~2 us a call (a generator plus two thread-count reads): a tenth of a
    # `cpu-ci` norm. Only variants that change the count pay for it.
    helpers = [] if threads is None else ["threads as _threads"]
    assignments = [f"{name} = {value!r}" for name, value in sorted(consts.items())]
    assignments += [] if threads is None else [f"THREADS = {threads!r}"]
    setup: list[str] = []
    kind, _, impl = variant.name.partition("-")
    if variant.name == "baseline":
        call = spec.baseline
    elif kind == "eager" and impl in spec.eager:
        call = spec.eager[impl]
    elif kind == "compile" and impl in spec.compiled:
        target, call = spec.compiled[impl]
        mode = params.pop("mode", "default")
        if "chunk" in params:
            assignments.append(f"CHUNK = {int(params.pop('chunk'))!r}")
        helpers.insert(0, "quiet_compile_threads")
        setup = ["quiet_compile_threads()",
                 f"_fn = torch.compile({target}, dynamic=False, options={_inductor_options(mode, threads)!r})"
                 f"  # mode {mode!r}"]
    elif variant.name == "triton":
        kw = ", ".join(f"{k}={v!r}" for k, v in sorted(params.items()))
        call = spec.triton.replace(", {kw}", f", {kw}" if kw else "")
        params = {}
    else:
        raise ValueError(f"unknown variant {variant.name!r} for {family}; it has baseline, triton, "
                         f"{', '.join('eager-' + n for n in spec.eager)} {', '.join('compile-' + n for n in spec.compiled)}")
    if params:
        raise ValueError(f"variant {variant.label} has parameters {sorted(params)} that {family} does not use")
    body = [f"    return {call}"] if threads is None else ["    with _threads(THREADS):", f"        return {call}"]
    lines = [
        f'"""dyno candidate for {workload or family}: {variant.label}."""',
        "import torch",
        "import torch.nn.functional as F",
        "",
        f"from optimizer.kernels import {spec.module} as _ops",
        *([f"from optimizer.kernels._common import {', '.join(helpers)}"] if helpers else []),
        "",
        *assignments,
        *([""] + setup if setup else []),
        "",
        "",
        f"def kernel({spec.args}):",
        *body,
        "",
    ]
    return "\n".join(lines)


def render_candidate(
    workload: str, family: str, variant: Variant, *, constants: dict[str, Any] | None = None
) -> Candidate:
    source = render_source(family, variant, constants=constants, workload=workload)
    return Candidate(workload=workload, name=variant.label, source=source,
                     params={"variant": variant.name, **variant.params})


def variant_from_params(params: dict[str, Any]) -> Variant:
    """Inverse of Candidate.params as written by render_candidate (for cache hits and artifacts)."""
    rest = dict(params)
    name = rest.pop("variant")
    return Variant(name, rest)


def candidate_space(
    workload: str, family: str, shape: dict[str, int], dtype: str, device: str,
    *, constants: dict[str, Any] | None = None,
) -> list[Candidate]:
    """Every candidate of the search space, rendered. The first one is the baseline."""
    del dtype  # the same formulations serve every dtype; the evaluator's checks are per dtype
    consts = family_constants(family, shape, constants)
    return [render_candidate(workload, family, v, constants=consts) for v in variants(family, shape, device)]


def load_kernel(source: str, name: str = "dyno_candidate") -> Callable[..., Any]:
    """Execute a candidate's source as a fresh module and return its `kernel`.

    For the optimizer's own uses of its candidates (model patches, development benchmarks); the
    runner loads candidates in its sandbox with its own loader.
    """
    import types

    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    kernel = module.__dict__.get("kernel")
    if not callable(kernel):
        raise ValueError(f"candidate source {name} defines no callable kernel(*inputs)")
    return kernel
