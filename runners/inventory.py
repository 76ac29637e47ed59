"""Workload inventory of an uploaded model: which suite workloads its eager forward pass runs, at
which shapes and dtypes, how often, and how much eager time each takes; plus its eager latency.

How the inventory is taken. After the timed passes the model runs a few more forwards (the first
one discarded, see `instrumented_inventory`) under three kinds of instruments, none of which changes
what runs: forward hooks on the modules that are a workload
(norms, linears, gated MLPs, MoE blocks, SSM mixers), a TorchFunctionMode that sees
`F.scaled_dot_product_attention` calls, and wrappers around the modeling module's own
`apply_rotary_pos_emb` / `eager_attention_forward`. Together they keep a stack of open *scopes*.
A TorchDispatchMode times every aten op and charges it to the innermost open scope (an MoE block
claims everything inside it, router and experts included); matrix products outside a linear,
attention, MoE or scan scope become GEMM entries of their own; the rest is reported per aten op under
`unclassified`, so nothing the model spends time on is silently dropped.

Shape conventions (tokens are flattened, as the kernels see them):
- gemm {M, K, N}: `a[M,K] @ b[K,N]`; M = batch x seq for a linear. A batched product adds
  attrs.batch; a linear with bias adds attrs.bias.
- rmsnorm / layernorm {R, H}: R rows of H. softmax {R, C}. swiglu {R, F}: gate and up are [R, F].
- rope {B, H, Hkv, S, D}: q is [B,H,S,D], k is [B,Hkv,S,D].
- attention_prefill {B, Hq, Hkv, S, D} with attrs.causal (False for encoders such as BERT);
  attention_decode {B, Hq, Hkv, L, D} (one query against L cached keys; `take_inventory` runs
  prefill forwards only, so it appears when `instrumented_inventory` is given decode inputs).
- moe {T, H, F, E, topk}: T tokens of width H routed top-k over E experts of intermediate size F.
- ssm_scan {B, D, L, N}: B sequences of length L, D = the mixer's inner width, N = the state size.
  The mixer's own work except its projections (GEMMs) and its causal conv1d (unclassified) counts.
"""

from __future__ import annotations

import inspect
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from runners.modelload import count_parameters, decoder_inputs, load_model

SCHEMA = "dyno.inventory/1"

Progress = Callable[[float, str], None]


class Family(StrEnum):
    """Suite v1 workload names (DESIGN.md); an inventory entry is optimisable when it has one."""

    RMSNORM = "rmsnorm"
    LAYERNORM = "layernorm"
    SOFTMAX = "softmax"
    SWIGLU = "swiglu"
    ROPE = "rope"
    GEMM = "gemm"
    ATTENTION_PREFILL = "attention_prefill"
    ATTENTION_DECODE = "attention_decode"
    MOE = "moe"
    SSM_SCAN = "ssm_scan"


_ATTENTION = (Family.ATTENTION_PREFILL, Family.ATTENTION_DECODE)

aten = torch.ops.aten
_MATMUL_OPS = {aten.mm, aten.addmm}
_BATCHED_MATMUL_OPS = {aten.bmm, aten.baddbmm}
_SOFTMAX_OPS = {aten._softmax, aten.softmax}
_LAYERNORM_OPS = {aten.native_layer_norm, aten.layer_norm}
_RMSNORM_OPS = {op for op in (getattr(aten, "rms_norm", None), getattr(aten, "_fused_rms_norm", None)) if op}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0


@dataclass
class _Scope:
    """One occurrence of a workload while it runs; becomes (part of) an inventory entry on close."""

    family: Family
    shape: dict[str, int] | None
    dtype: str | None
    attrs: dict[str, Any] = field(default_factory=dict)
    claims_nested: bool = False  # an MoE block owns its router's and experts' GEMMs
    shape_from_op: bool = False  # a linear's exact (M, K, N) comes from the product it runs
    absorbed: bool = False  # opened inside an MoE block: its time is the block's, it is no entry
    time_s: float = 0.0


@dataclass
class _Tally:
    family: Family
    shape: dict[str, int]
    dtype: str
    attrs: dict[str, Any]
    count: int = 0
    time_s: float = 0.0


class _Recorder:
    """The scope stack and the tallies; fed by hooks, wrappers and the two torch modes."""

    def __init__(self, config: transformers.PretrainedConfig, sync: Callable[[], None]) -> None:
        self.config = config
        self.sync = sync
        self.stack: list[_Scope] = []
        self.tallies: dict[tuple[Any, ...], _Tally] = {}
        self.unclassified: dict[str, list[float]] = {}
        self.muted = 0  # >0 while the recorder itself computes (mask inspection), so it is not timed

    # -- scopes ---------------------------------------------------------------------------------
    def open(self, scope: _Scope) -> None:
        scope.absorbed = any(outer.claims_nested for outer in self.stack)
        self.stack.append(scope)

    def close(self, scope: _Scope) -> None:
        # Hooks fire in strict nesting, so the scope closing is the innermost one; anything else means
        # a forward raised half-way, and the inventory of that pass is void anyway.
        if not self.stack or self.stack[-1] is not scope:
            raise RuntimeError("profile scopes closed out of order; the instrumented pass is inconsistent")
        self.stack.pop()
        if not scope.absorbed:
            self._tally(scope)

    def _unclassified(self, name: str, elapsed: float) -> None:
        entry = self.unclassified.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += elapsed

    def _tally(self, scope: _Scope) -> None:
        if scope.shape is None or scope.dtype is None:
            self._unclassified(f"{scope.family} (shape unknown)", scope.time_s)
            return
        key = (scope.family, tuple(scope.shape.items()), scope.dtype, tuple(sorted(scope.attrs.items())))
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = _Tally(scope.family, dict(scope.shape), scope.dtype, dict(scope.attrs))
        tally.count += 1
        tally.time_s += scope.time_s

    def _owner(self) -> _Scope | None:
        for scope in self.stack:
            if scope.claims_nested:
                return scope
        return self.stack[-1] if self.stack else None

    # -- aten ops -------------------------------------------------------------------------------
    def op(self, func: Any, args: tuple[Any, ...], elapsed: float) -> None:
        packet = func.overloadpacket
        owner = self._owner()
        family = owner.family if owner else None
        if packet in _MATMUL_OPS and family not in (Family.GEMM, Family.MOE, *_ATTENTION):
            self._tally(_gemm_scope_from_op(packet, args, elapsed))
        elif packet in _BATCHED_MATMUL_OPS and family not in (Family.GEMM, Family.MOE, Family.SSM_SCAN, *_ATTENTION):
            self._tally(_gemm_scope_from_op(packet, args, elapsed))
        elif owner is None or (family is Family.SSM_SCAN and packet is aten.convolution):
            standalone = _standalone_scope(packet, args, elapsed)
            if standalone is not None:
                self._tally(standalone)
            else:
                self._unclassified(str(packet), elapsed)
        else:
            owner.time_s += elapsed
            if owner.shape_from_op and (packet in _MATMUL_OPS or packet in _BATCHED_MATMUL_OPS):
                exact = _gemm_scope_from_op(packet, args, 0.0)
                owner.shape, owner.dtype = exact.shape, exact.dtype
                owner.attrs = {**owner.attrs, **exact.attrs}
                owner.shape_from_op = False


def _gemm_scope_from_op(packet: Any, args: tuple[Any, ...], elapsed: float) -> _Scope:
    if packet in _MATMUL_OPS:
        a, b = (args[1], args[2]) if packet is aten.addmm else (args[0], args[1])
        attrs: dict[str, Any] = {"bias": True} if packet is aten.addmm else {}
        shape = {"M": a.shape[0], "K": a.shape[1], "N": b.shape[1]}
    else:
        a, b = (args[1], args[2]) if packet is aten.baddbmm else (args[0], args[1])
        attrs = {"batch": a.shape[0], **({"bias": True} if packet is aten.baddbmm else {})}
        shape = {"M": a.shape[1], "K": a.shape[2], "N": b.shape[2]}
    return _Scope(Family.GEMM, shape, _dtype_name(a.dtype), attrs, time_s=elapsed)


def _standalone_scope(packet: Any, args: tuple[Any, ...], elapsed: float) -> _Scope | None:
    """Suite ops a model calls directly (F.softmax, F.layer_norm, F.rms_norm) outside any module scope."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None or x.dim() == 0:
        return None
    if packet in _SOFTMAX_OPS:
        dim = args[1] % x.dim()
        return _Scope(Family.SOFTMAX, {"R": x.numel() // x.shape[dim], "C": x.shape[dim]}, _dtype_name(x.dtype), time_s=elapsed)
    if packet in _LAYERNORM_OPS:
        return _Scope(Family.LAYERNORM, {"R": _rows(x), "H": x.shape[-1]}, _dtype_name(x.dtype), time_s=elapsed)
    if packet in _RMSNORM_OPS:
        return _Scope(Family.RMSNORM, {"R": _rows(x), "H": x.shape[-1]}, _dtype_name(x.dtype), time_s=elapsed)
    return None


# -- module classification ----------------------------------------------------------------------

ScopeFactory = Callable[[tuple[Any, ...], dict[str, Any]], _Scope | None]


def _config_int(config: transformers.PretrainedConfig, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _is_silu(module: torch.nn.Module | None, config: transformers.PretrainedConfig) -> bool:
    if isinstance(module, torch.nn.SiLU) or "silu" in type(module).__name__.lower():
        return True
    return getattr(config, "hidden_act", None) in ("silu", "swish")


def _classify(module: torch.nn.Module, config: transformers.PretrainedConfig) -> ScopeFactory | None:
    """If `module` is a workload, a factory that builds its scope from the forward's inputs."""
    name = type(module).__name__
    experts = getattr(module, "experts", None)
    if isinstance(experts, torch.nn.Module) and (hasattr(module, "gate") or hasattr(module, "router")):
        return _moe_factory(module, experts, config)
    if isinstance(getattr(module, "A_log", None), torch.Tensor) and hasattr(module, "D"):
        return _ssm_factory(module, config)
    norm = _norm_family(module)
    if norm is not None:
        return _norm_factory(norm)
    if isinstance(module, torch.nn.Linear) or name == "Conv1D":
        return _linear_factory(module)
    gate, up = getattr(module, "gate_proj", None), getattr(module, "up_proj", None)
    if isinstance(gate, torch.nn.Module) and isinstance(up, torch.nn.Module) and _is_silu(getattr(module, "act_fn", None), config):
        return _swiglu_factory(gate)
    return None


def _norm_family(module: torch.nn.Module) -> Family | None:
    if isinstance(module, torch.nn.LayerNorm):
        return Family.LAYERNORM
    name = type(module).__name__
    if isinstance(module, torch.nn.RMSNorm) or name.endswith("RMSNorm"):
        return Family.RMSNORM
    if name.endswith("LayerNorm"):
        # Some models name an RMS norm "LayerNorm" (T5LayerNorm): no bias and a variance epsilon give it away.
        if getattr(module, "bias", None) is None and hasattr(module, "variance_epsilon"):
            return Family.RMSNORM
        return Family.LAYERNORM
    return None


def _norm_factory(family: Family) -> ScopeFactory:
    def factory(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Scope | None:
        x = _first_tensor(args, kwargs)
        if x is None:
            return None
        return _Scope(family, {"R": _rows(x), "H": x.shape[-1]}, _dtype_name(x.dtype))

    return factory


def _linear_factory(module: torch.nn.Module) -> ScopeFactory:
    weight = getattr(module, "weight", None)
    # nn.Linear stores [out, in]; transformers' GPT-2 style Conv1D stores [in, out].
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        k, n = (weight.shape[1], weight.shape[0]) if isinstance(module, torch.nn.Linear) else tuple(weight.shape)
    else:
        k = n = 0
    has_bias = getattr(module, "bias", None) is not None

    def factory(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Scope | None:
        x = _first_tensor(args, kwargs)
        if x is None or not k:
            return None
        shape = {"M": x.numel() // k, "K": k, "N": n}
        attrs = {"bias": True} if has_bias else {}
        return _Scope(Family.GEMM, shape, _dtype_name(x.dtype), attrs, shape_from_op=True)

    return factory


def _swiglu_factory(gate: torch.nn.Module) -> ScopeFactory:
    width = getattr(gate, "out_features", None)

    def factory(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Scope | None:
        x = _first_tensor(args, kwargs)
        if x is None or not width:
            return None
        return _Scope(Family.SWIGLU, {"R": _rows(x), "F": width}, _dtype_name(x.dtype))

    return factory


def _moe_factory(module: torch.nn.Module, experts: torch.nn.Module, config: transformers.PretrainedConfig) -> ScopeFactory:
    n_experts = (
        getattr(experts, "num_experts", None)
        or (len(experts) if isinstance(experts, torch.nn.ModuleList) else None)
        or _config_int(config, "num_local_experts", "num_experts", "n_routed_experts")
    )
    top_k = getattr(module, "top_k", None) or _config_int(config, "num_experts_per_tok", "moe_topk", "top_k")
    width = getattr(experts, "intermediate_dim", None) or _config_int(
        config, "moe_intermediate_size", "expert_intermediate_size", "intermediate_size"
    )

    def factory(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Scope | None:
        x = _first_tensor(args, kwargs)
        if x is None or not (n_experts and top_k and width):
            return None
        shape = {"T": _rows(x), "H": x.shape[-1], "F": int(width), "E": int(n_experts), "topk": int(top_k)}
        return _Scope(Family.MOE, shape, _dtype_name(x.dtype), claims_nested=True)

    return factory


def _ssm_factory(module: torch.nn.Module, config: transformers.PretrainedConfig) -> ScopeFactory:
    inner = getattr(module, "intermediate_size", None) or _config_int(config, "intermediate_size")
    state = getattr(module, "ssm_state_size", None) or _config_int(config, "state_size", "ssm_state_size")

    def factory(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Scope | None:
        x = _first_tensor(args, kwargs)
        if x is None or x.dim() != 3 or not (inner and state):
            return None
        shape = {"B": x.shape[0], "D": int(inner), "L": x.shape[1], "N": int(state)}
        return _Scope(Family.SSM_SCAN, shape, _dtype_name(x.dtype))

    return factory


# -- attention and rope -------------------------------------------------------------------------


def _kv_heads(recorder: _Recorder, q_heads: int, k_heads: int) -> int:
    """K/V heads as the model defines them: transformers may have repeated them to Hq before the call."""
    configured = _config_int(recorder.config, "num_key_value_heads")
    if k_heads == q_heads and configured and configured < q_heads and q_heads % configured == 0:
        return configured
    return k_heads


def _mask_is_causal(mask: torch.Tensor, s: int, length: int) -> bool:
    if mask.dim() < 2 or s < 2:
        return False
    tail = mask[..., -s:, -length:]
    blocked = ~tail if tail.dtype == torch.bool else tail <= torch.finfo(tail.dtype).min / 2
    future = torch.ones(s, length, dtype=torch.bool, device=mask.device).triu(length - s + 1)
    return bool(future.any()) and bool(blocked[..., future].all())


def _attention_scope(
    recorder: _Recorder, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal_flag: bool
) -> _Scope:
    b, hq, s, d = q.shape
    hkv, length = _kv_heads(recorder, hq, k.shape[1]), k.shape[-2]
    if s == 1 and length > 1:
        return _Scope(Family.ATTENTION_DECODE, {"B": b, "Hq": hq, "Hkv": hkv, "L": length, "D": d}, _dtype_name(q.dtype))
    recorder.muted += 1
    try:
        causal = causal_flag or (mask is not None and _mask_is_causal(mask, s, length))
    finally:
        recorder.muted -= 1
    attrs: dict[str, Any] = {"causal": bool(causal)}
    if length != s:
        attrs["kv_len"] = length
    return _Scope(Family.ATTENTION_PREFILL, {"B": b, "Hq": hq, "Hkv": hkv, "S": s, "D": d}, _dtype_name(q.dtype), attrs)


def _bind(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    return dict(bound.arguments)


class _SdpaWatch(TorchFunctionMode):
    """Opens an attention scope around each `F.scaled_dot_product_attention`, whatever backend it picks."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or self.recorder.muted:
            return func(*args, **kwargs)
        q, k = args[0], args[1]
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
        scope = _attention_scope(self.recorder, q, k, mask, bool(causal))
        self.recorder.open(scope)
        try:
            return func(*args, **kwargs)
        finally:
            self.recorder.close(scope)


class _OpTimer(TorchDispatchMode):
    """Times every aten op (synchronising the device around it) and hands it to the recorder."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self.recorder.muted:
            return func(*args, **kwargs)
        self.recorder.sync()
        start = time.perf_counter()
        out = func(*args, **kwargs)
        self.recorder.sync()
        self.recorder.op(func, args, time.perf_counter() - start)
        return out


def _rope_wrapper(recorder: _Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_rotary_pos_emb(*args: Any, **kwargs: Any) -> Any:
        bound = _bind(original, args, kwargs)
        q, k = bound.get("q"), bound.get("k")
        scope = None
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4:
            head_dim = 2 if bound.get("unsqueeze_dim", 1) == 2 else 1  # [B,S,H,D] layout when 2
            seq_dim = 1 if head_dim == 2 else 2
            shape = {"B": q.shape[0], "H": q.shape[head_dim], "Hkv": k.shape[head_dim], "S": q.shape[seq_dim], "D": q.shape[-1]}
            scope = _Scope(Family.ROPE, shape, _dtype_name(q.dtype))
            recorder.open(scope)
        try:
            return original(*args, **kwargs)
        finally:
            if scope is not None:
                recorder.close(scope)

    return apply_rotary_pos_emb


def _eager_attention_wrapper(recorder: _Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    def eager_attention_forward(*args: Any, **kwargs: Any) -> Any:
        bound = _bind(original, args, kwargs)
        q, k, module = bound.get("query"), bound.get("key"), bound.get("module")
        scope = None
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4:
            mask = bound.get("attention_mask")
            causal_attr = bool(getattr(module, "is_causal", False)) and mask is None
            scope = _attention_scope(recorder, q, k, mask if isinstance(mask, torch.Tensor) else None, causal_attr)
            recorder.open(scope)
        try:
            return original(*args, **kwargs)
        finally:
            if scope is not None:
                recorder.close(scope)

    return eager_attention_forward


_FUNCTION_WRAPPERS: dict[str, Callable[[_Recorder, Callable[..., Any]], Callable[..., Any]]] = {
    "apply_rotary_pos_emb": _rope_wrapper,
    "eager_attention_forward": _eager_attention_wrapper,
}


@contextmanager
def _instrumented(model: torch.nn.Module, recorder: _Recorder) -> Iterator[None]:
    """Hooks, function wrappers and both torch modes for one pass; everything is undone on exit.

    The function wrappers replace module globals of the model's modeling files, so another thread
    running the same architecture in this process during the pass would be recorded too: runners
    inventory one model per process.
    """
    with ExitStack() as stack:
        for module in model.modules():
            factory = _classify(module, recorder.config)
            if factory is not None:
                _attach_scope_hooks(stack, module, factory, recorder)
        modeling = {sys.modules.get(type(m).__module__) for m in model.modules()}
        for namespace in modeling:
            for name, wrap in _FUNCTION_WRAPPERS.items():
                original = getattr(namespace, name, None) if namespace else None
                if callable(original):
                    setattr(namespace, name, wrap(recorder, original))
                    stack.callback(setattr, namespace, name, original)
        stack.enter_context(_SdpaWatch(recorder))
        stack.enter_context(_OpTimer(recorder))
        yield


def _attach_scope_hooks(stack: ExitStack, module: torch.nn.Module, factory: ScopeFactory, recorder: _Recorder) -> None:
    opened: list[_Scope | None] = []

    def before(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        scope = factory(args, kwargs)
        opened.append(scope)
        if scope is not None:
            recorder.open(scope)

    def after(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        scope = opened.pop()
        if scope is not None:
            recorder.close(scope)

    stack.callback(module.register_forward_pre_hook(before, with_kwargs=True).remove)
    stack.callback(module.register_forward_hook(after, with_kwargs=True).remove)


# -- the inventory ------------------------------------------------------------------------------


def _device_sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _vocab_size(config: transformers.PretrainedConfig) -> int:
    vocab = _config_int(config, "vocab_size") or _config_int(getattr(config, "text_config", None) or config, "vocab_size")
    if not vocab:
        raise ValueError(f"{config.model_type} config has no vocab_size; Dyno profiles token-input models only")
    return vocab


def make_inputs(
    model: torch.nn.Module, config: transformers.PretrainedConfig, *, batch: int, seq: int, device: str, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Seeded token ids inside the vocabulary, plus an all-ones attention mask where the model takes one
    (what a tokenizer hands over for unpadded text)."""
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be positive, got batch={batch} seq={seq}")
    limit = _config_int(config, "max_position_embeddings", "n_positions")
    if limit and seq > limit:
        raise ValueError(f"seq={seq} exceeds the model's max_position_embeddings={limit}; profile a shorter sequence")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, _vocab_size(config), (batch, seq), generator=generator)
    inputs = {"input_ids": ids.to(device), **decoder_inputs(config, batch=batch, device=device)}
    if "attention_mask" in inspect.signature(model.forward).parameters:
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long, device=device)
    return inputs


def _main_dtype(model: torch.nn.Module) -> str:
    by_dtype: dict[torch.dtype, int] = {}
    for p in model.parameters():
        by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
    return _dtype_name(max(by_dtype, key=by_dtype.__getitem__)) if by_dtype else "float32"


def instrumented_inventory(
    model: torch.nn.Module,
    config: transformers.PretrainedConfig,
    inputs: dict[str, torch.Tensor],
    device: str,
    *,
    passes: int = 2,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Instrumented forwards -> (workload entries, unclassified ops), in first-seen order.

    A first instrumented pass is discarded: the first call of each op through the Python dispatch
    path pays one-off costs (milliseconds on CPU) that would be charged to whichever workload met
    it first. Each entry's `eager_time_s` is then the median over `passes` passes of its total
    time across its `count` occurrences in one forward.
    """
    recorders = []
    for _ in range(passes + 1):
        recorder = _Recorder(config, _device_sync(torch.device(device)))
        with torch.no_grad(), _instrumented(model, recorder):
            model(**inputs)
        recorders.append(recorder)
    kept = recorders[1:]
    last = kept[-1]
    workloads = []
    for key, tally in last.tallies.items():
        entry: dict[str, Any] = {
            "family": str(tally.family),
            "shape": tally.shape,
            "dtype": tally.dtype,
            "count": tally.count,
            "eager_time_s": statistics.median(r.tallies[key].time_s if key in r.tallies else 0.0 for r in kept),
        }
        if tally.attrs:
            entry["attrs"] = tally.attrs
        workloads.append(entry)
    unclassified = [
        {
            "op": op,
            "count": int(count),
            "eager_time_s": statistics.median(r.unclassified.get(op, (0, 0.0))[1] for r in kept),
        }
        for op, (count, _) in last.unclassified.items()
    ]
    unclassified.sort(key=lambda row: -row["eager_time_s"])
    return workloads, unclassified


# What profiling may map beyond the process's address space on a CPU host: the sandbox's own
# per-worker memory limit (runners.sandbox.SandboxConfig.memory_bytes), so an architecture card
# built with random weights here cannot take more than it could in a sandboxed worker.
PROFILE_MEMORY_BYTES = 8 << 30


class InventoryMemoryExceeded(MemoryError):
    """The model did not fit in the memory an inventory may use; the message says how much that is."""


@contextmanager
def address_space_window(extra_bytes: int) -> Iterator[None]:
    """Lower this process's soft address-space limit to what it maps now plus `extra_bytes`, and
    put it back after (a soft limit may be raised again up to the hard one). Allocations past it
    fail (MemoryError, or torch's RuntimeError) instead of taking the host's memory."""
    import os
    import resource

    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + extra_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, soft)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def take_inventory(
    model_dir: Path,
    *,
    batch: int,
    seq: int,
    device: str = "cpu",
    repeats: int = 3,
    progress: Progress | None = None,
    seed: int = 0,
    memory_bytes: int | None = PROFILE_MEMORY_BYTES,
) -> dict[str, Any]:
    """Load the model, time `repeats` eager forwards after a warm-up, take its workload inventory.

    Uses the torch thread count the caller configured. Returns a JSON-serialisable dict with
    schema `dyno.inventory/1` (see the module docstring for the shape keys). On CPU the model is
    built and run under an address-space window of `memory_bytes` beyond what the process maps
    (None: no window; a GPU's driver maps far more address space than it uses, so none there):
    a model that needs more raises InventoryMemoryExceeded.
    """
    if memory_bytes is None or device != "cpu":
        return _take_inventory(Path(model_dir), batch=batch, seq=seq, device=device, repeats=repeats,
                              progress=progress, seed=seed)
    try:
        with address_space_window(memory_bytes):
            return _take_inventory(Path(model_dir), batch=batch, seq=seq, device=device, repeats=repeats,
                                  progress=progress, seed=seed)
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "alloc" not in str(exc).lower():
            raise
        raise InventoryMemoryExceeded(
            f"the model needs more than the {memory_bytes / 2**30:.1f} GiB an inventory may use at batch {batch} x seq "
            f"{seq} on CPU; choose a smaller batch or sequence, or a smaller model") from None


def _take_inventory(model_dir: Path, *, batch: int, seq: int, device: str, repeats: int,
                   progress: Progress | None, seed: int) -> dict[str, Any]:
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    report = progress or (lambda fraction, message: None)
    report(0.0, f"loading model from {Path(model_dir).name}")
    model, config = load_model(Path(model_dir), device=device, seed=seed)
    parameters = count_parameters(model)
    report(0.15, f"loaded {type(model).__name__}: {parameters:,} parameters")
    inputs = make_inputs(model, config, batch=batch, seq=seq, device=device, seed=seed)
    sync = _device_sync(torch.device(device))

    samples: list[float] = []
    with torch.no_grad():
        report(0.2, f"warm-up forward at batch {batch} x seq {seq}")
        model(**inputs)
        sync()
        for i in range(repeats):
            start = time.perf_counter()
            model(**inputs)
            sync()
            samples.append(time.perf_counter() - start)
            report(0.2 + 0.6 * (i + 1) / repeats, f"timed forward {i + 1}/{repeats}: {samples[-1] * 1e3:.2f} ms")

    report(0.85, "instrumented forward: recording workloads")
    workloads, unclassified = instrumented_inventory(model, config, inputs, device, passes=min(repeats, 3))
    classified_s = sum(w["eager_time_s"] for w in workloads)
    unclassified_s = sum(row["eager_time_s"] for row in unclassified)
    report(1.0, f"inventory: {len(workloads)} workloads, {classified_s / max(classified_s + unclassified_s, 1e-12):.0%} of op time classified")
    return {
        "schema": SCHEMA,
        "model": {
            "family": config.model_type,
            "architecture": type(model).__name__,
            "parameter_count": parameters,
        },
        "batch": batch,
        "seq": seq,
        "device": device,
        "dtype": _main_dtype(model),
        "workloads": workloads,
        "unclassified": unclassified,
        "instrumented_time_s": {"classified": classified_s, "unclassified": unclassified_s},
        "eager_latency_s": {"median": statistics.median(samples), "samples": samples},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
