"""The whole-model audit's worker: what a sandboxed worker runs instead of the per-kernel
`runners.audit.worker.KernelWorker` (SandboxConfig.worker_handler). Untrusted side: it runs beside
the artifact's code, which can patch it; the parent (runners.modelaudit) relies on nothing here but
what it checks from outside (timestamps against its own clock, committed checksums, fetched logits).
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import torch

from runners import checks
from runners.audit.model_inputs import commit_weights, round_tokens, row_commitments
from runners.measure import candidate_fault
from runners.modelload import decoder_inputs, load_model  # before transformers: it makes the hub offline
from runners.sandbox.wire import WorkerFault

# The sandbox's zygote imports this module before it forks workers (SandboxConfig.worker_handler),
# so every worker starts with transformers' model-loading machinery in memory: imported lazily, it
# cost each worker ~3.5 s of a ~4 s tiny-model load on the 2-core development box.
import transformers.modeling_utils  # noqa: E402,F401


def _logits(out: Any) -> torch.Tensor:
    """The model's main output: logits where it has them, else the last hidden state. (The optimizer
    has its own for its self-check; the harness does not borrow the graded party's helpers.)"""
    for attr in ("logits", "last_hidden_state"):
        value = getattr(out, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"cannot find the output tensor of a {type(out).__name__}")


def _transformed(model: Any, result: Any) -> Any:
    """What a transform returned, or the model it changed in place (None). Not `result or model`:
    the truth of a module wrapper can mean calling its len()."""
    return model if result is None else result


def _cache_of(out: Any) -> Any:
    """The key/value cache a forward with use_cache=True returned (transformers 5: `cache`)."""
    for attr in ("cache", "past_key_values"):
        value = getattr(out, attr, None)
        if value is not None:
            return value
    return None


# Decode's first timed call carries this many new tokens per batch entry where the model's cache is
# keys and values (runners.modelaudit._reveal): every later call's input is that call's cache plus
# its own token, and the first call's is the prompt's cache plus two tokens revealed with it. A
# table of the first call's outputs would have vocabulary-squared entries; one over its first token
# (vocabulary-many, buildable from the prompt alone) spares only the second token's share of a
# two-token step, which over a cache costs about what a one-token step does.
_FIRST_STEP_TOKENS = 2


def _takes_several_tokens(cache: Any) -> bool:
    """Whether a decode step may append several tokens to `cache` at once: only where every layer
    holds keys and values. A recurrent layer (a state-space model's conv and scan state) steps one
    token at a time in transformers (a longer step there restarts the scan from zero)."""
    from transformers import cache_utils

    recurrent = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())
    inner = getattr(cache, "self_attention_cache", cache)  # an encoder-decoder's decoder cache
    layers = getattr(inner, "layers", None)
    return bool(layers) and all(isinstance(layer, cache_utils.CacheLayerMixin) and not isinstance(layer, recurrent)
                                for layer in layers)


def _mask_on_cached_steps(model: Any) -> bool:
    """Whether the model's own generation passes an attention mask on a step over its cache
    (decoders with attention do; a state-space model's drops it). Asked of the model itself, so
    that each arm's decode is called as generation calls it."""
    try:
        ids = torch.zeros(1, 2, dtype=torch.long, device=next(model.parameters()).device)
        kwargs = model.prepare_inputs_for_generation(ids, attention_mask=torch.ones_like(ids), use_cache=True,
                                                     is_first_iteration=False)
    except Exception:  # a model without generation's helpers: keep the mask
        return True
    return kwargs.get("attention_mask") is not None


_CACHE_ARGS = ("cache", "past_key_values")  # the names a forward takes its key/value cache by


def _item(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A `step` request's one int64 vector: [call set, token ids...] (runners.audit.model_sample)."""
    if len(tensors) != 1 or tensors[0].dtype != torch.int64 or tensors[0].dim() != 1 or not len(tensors[0]):
        raise ValueError("a step carries one non-empty int64 vector of token ids")
    return tensors[0]


class ModelRunner:
    """Loads one model (optionally with an artifact applied) and times its forward on the parent's tokens.

    Ops: ping, load, prepare, step (one timed call, runners.audit.model_sample), fetch, release."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.model: torch.nn.Module | None = None
        self.config: Any = None
        self.cache_arg: str | None = None
        self.takes_mask = False
        self.phase = ""
        self.seq = 0
        self.caches: list[Any] = []  # decode: the round's one prefilled cache, which each step extends
        self.encoded: list[torch.Tensor] = []  # decode of an encoder-decoder: the prompt's encoder output
        self.decoded = 0  # decode: tokens appended to the cache since prepare
        self.step_mask = True  # decode steps of a decoder pass the attention mask (generation's convention)
        self.generates = False  # the model has a next-token step over a cache (decode is audited)
        self.masks: dict[tuple[int, int], torch.Tensor] = {}  # the round's attention masks by (batch, length)
        self.batch = 0
        self.mask: dict[str, torch.Tensor] = {}
        self.weights: torch.Tensor | None = None
        self.commit_seed = 0
        self.outputs: list[torch.Tensor] = []
        self.calls = 0  # the round's calls per sample (prepare)
        # Read by the worker's loop (runners.sandbox.zygote.serve): after a step that is not its
        # sample's last, the parent's next step follows at once, and every worker polls for it.
        self.next_request_soon = False

    def handle(self, op: str, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        method = getattr(self, f"op_{op}", None)
        if method is None:
            raise ValueError(f"unknown op {op!r}")
        self.next_request_soon = False
        return method(header, tensors)

    def op_ping(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        return {"pid": os.getpid()}, []

    def op_load(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        import inspect

        started = time.perf_counter()
        seconds: dict[str, float] = {}
        try:
            model, config = load_model(Path(header["model_dir"]), device=self.device)
        except BaseException as exc:
            raise candidate_fault(exc, during="loading the model", code="harness.error") from None
        seconds["load"] = time.perf_counter() - started
        if header.get("apply"):
            try:  # runners.artifact.applier_source: the artifact's own applier, run here, in the sandbox
                namespace = {"__name__": "dyno_artifact_applier"}
                exec(compile(header["apply"], "artifact_applier.py", "exec"), namespace)
                model = _transformed(model, namespace["transform"](model))
            except BaseException as exc:
                raise candidate_fault(exc, during="applying the optimization artifact", code="sandbox.import_error") from None
        if header.get("transform"):
            try:
                namespace: dict[str, Any] = {"__name__": "dyno_model_transform"}
                exec(compile(header["transform"], "model_transform.py", "exec"), namespace)
                model = _transformed(model, namespace["transform"](model))
            except BaseException as exc:
                raise candidate_fault(exc, during="the model transform", code="sandbox.import_error") from None
        convention = header.get("convention")
        decode_note = None
        if isinstance(convention, dict):
            # How the trusted baseline calls the unmodified model (its load's answer), imposed: an
            # optimized model is called exactly so. Read from its own signature, a transform that
            # hid `forward`'s parameters behind **kwargs had its prefill called without the cache
            # and the mask, a cheaper workload than the baseline's (red team 12, 2026-12-06).
            cache_arg = convention.get("cache_arg")
            self.cache_arg = cache_arg if cache_arg in _CACHE_ARGS else None
            self.takes_mask = convention.get("takes_mask") is True
            self.generates = convention.get("generates") is True and self.cache_arg is not None
            self.step_mask = self.takes_mask and convention.get("step_mask") is True
            if not self.generates:
                decode_note = "the unmodified model has no next-token step"
        else:
            params = inspect.signature(model.forward).parameters
            self.cache_arg = next((name for name in _CACHE_ARGS if name in params), None)
            self.takes_mask = "attention_mask" in params
            if not model.can_generate():
                decode_note = f"{type(model).__name__} does not generate text, so it has no next-token step"
            elif self.cache_arg is None:
                decode_note = f"{type(model).__name__}.forward takes no key/value cache"
            self.generates = decode_note is None
            self.step_mask = self.takes_mask and _mask_on_cached_steps(model)
        self.model, self.config = model, config  # the config as loaded: a transform cannot change it
        first_step_tokens = None
        if header.get("probe_decode") and decode_note is None:
            first_step_tokens = self._first_step_tokens()
        # Whatever loading built stays; collections in `prepare` then only see the round's objects.
        gc.collect()
        gc.freeze()
        first = next(model.parameters(), None)
        seconds["total"] = time.perf_counter() - started
        return {
            "seconds": seconds,
            "model_class": type(model).__name__,
            "dtype": str(first.dtype).removeprefix("torch.") if first is not None else "float32",
            "decode": decode_note is None,
            "decode_note": decode_note,
            # How many new tokens decode's first step may carry (asked of the trusted baseline only:
            # the parent uses its answer): two over a key/value cache, one over a recurrent state.
            "first_step_tokens": first_step_tokens,
            # How this worker calls its model; the parent hands the trusted baseline's to the others.
            "convention": {"cache_arg": self.cache_arg, "takes_mask": self.takes_mask, "generates": self.generates,
                           "step_mask": self.step_mask},
        }, []

    def _first_step_tokens(self) -> int:
        """Decode's first step's tokens per batch entry, from the cache a two-token prompt leaves."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        out = self._forward({"input_ids": ids, "use_cache": True, **self._mask(1, 2, prebuilt=False),
                             **decoder_inputs(self.config, batch=1, device=self.device)}, "a two-token prompt at load")
        cache = _cache_of(out)
        if cache is None:
            raise WorkerFault("harness.error", "the model returned no key/value cache with use_cache=True")
        return _FIRST_STEP_TOKENS if _takes_several_tokens(cache) else 1

    def _forward(self, kwargs: dict[str, Any], during: str) -> Any:
        assert self.model is not None
        try:
            with torch.no_grad():
                return self.model(**kwargs)
        except BaseException as exc:
            raise candidate_fault(exc, during=during, code="sandbox.candidate_exception") from None

    def _mask(self, batch: int, length: int, *, prebuilt: bool = True) -> dict[str, torch.Tensor]:
        """The all-ones mask of `length`: in a round, the one `prepare` built (every window's; a
        length it did not build is the harness's error, never silently built inside a window)."""
        if not self.takes_mask:
            return {}
        mask = self.masks.get((batch, length))
        if mask is None:
            if prebuilt:
                raise RuntimeError(f"harness: no attention mask of {batch} x {length} was built in prepare")
            mask = torch.ones(batch, length, dtype=torch.long, device=self.device)
        return {"attention_mask": mask}

    def _prebuild_masks(self, batch: int, lengths: range) -> None:
        """The round's all-ones attention masks, built here, outside every window: inside one, the
        harness's own tensor building is time a patched worker could skip and bill as speed (a red
        team dropped the masks in its worker's call building, seventh session)."""
        self.masks = {(batch, length): torch.ones(batch, length, dtype=torch.long, device=self.device)
                      for length in lengths} if self.takes_mask else {}

    def op_prepare(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The round's settings, nothing of its tokens: every call's come with its own `step`."""
        self.caches, self.outputs, self.encoded = [], [], []
        # Collections happen here, outside every timed window (automatic GC is off in workers);
        # freezing what survives keeps the next ones as cheap for a model that compiled on its
        # first call (dynamo's objects) as for the eager one, so preparing costs both alike.
        gc.collect()
        gc.freeze()
        self.phase, self.seq, self.calls = str(header["phase"]), int(header["seq"]), int(header["calls"])
        batch = self.batch = int(header["batch"])
        # Decode's prompt and every step's length (a first step of up to two tokens, then one a step).
        self._prebuild_masks(batch, range(self.seq, self.seq + self.calls + 2) if self.phase == "decode" else range(self.seq, self.seq + 1))
        if self.phase == "prefill":
            # Nothing of the round's tokens: each call's window comes with its own request.
            self.mask = {**self._mask(batch, self.seq), **decoder_inputs(self.config, batch=batch, device=self.device)}
        elif self.phase == "decode":
            # Nothing of the round's prompt: it comes with the sample's first request, whose window
            # the parent times and judges (runners.modelaudit._judge_prompt). Prefilled here, outside
            # every window, it was held only to the trusted workers' prefill: a model whose prefill
            # is faster had the difference free for work for its decode steps.
            self.caches, self.encoded, self.decoded = [], [], 0
            self.mask = {}
        else:
            raise ValueError(f"unknown phase {self.phase!r}")
        self.commit_seed = int(header["commit_seed"])
        self.weights = None
        self._sync()
        return {}, []

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def _prompt_inputs(self, item: torch.Tensor) -> tuple[dict[str, Any], int]:
        """Decode's first call: the round's prompt, [0, batch x seq token ids], prefilled with a cache
        that the sample's later calls extend. An encoder-decoder's prompt goes through the encoder
        (and the decoder's start token) here; its steps then reuse the encoder output."""
        if len(item) != 1 + self.batch * self.seq:
            raise ValueError(f"decode's prompt carries {self.batch} x {self.seq} token ids, got {len(item) - 1}")
        ids = item[1:].to(self.device).view(self.batch, self.seq)
        self.caches, self.encoded, self.decoded = [], [], 0
        return {"input_ids": ids, "use_cache": True, **self._mask(self.batch, self.seq),
                **decoder_inputs(self.config, batch=self.batch, device=self.device)}, 0

    def _keep_prompt_state(self, out: Any) -> None:
        """The prompt's cache (and an encoder-decoder's encoder output and mask) for the steps after it."""
        cache = _cache_of(out)
        if cache is None:
            raise WorkerFault("harness.error", "the model returned no key/value cache with use_cache=True")
        self.caches = [cache]
        if getattr(self.config, "is_encoder_decoder", False):
            encoded = getattr(out, "encoder_last_hidden_state", None)
            if not isinstance(encoded, torch.Tensor):
                raise WorkerFault("harness.error", "the encoder-decoder model returned no encoder output")
            self.encoded = [encoded]
            self.mask = self._mask(self.batch, self.seq)  # the encoder's, as the prompt's

    def _call_inputs(self, item: torch.Tensor) -> tuple[dict[str, Any], int]:
        """One call's keyword arguments from what its `step` reveals ([call, batch x seq token ids]
        for prefill, [0, new tokens of every batch entry] for decode) and how many tokens per batch
        entry it appends to decode's cache (0 for prefill)."""
        index = int(item[0])
        if self.phase == "prefill":
            if len(item) != 1 + self.batch * self.seq:
                raise ValueError(f"a prefill step carries {self.batch} x {self.seq} token ids, got {len(item) - 1}")
            ids = item[1:].to(self.device).view(self.batch, self.seq)
            # A model that generates prefills as generation does, with the cache it would keep: the
            # same call as decode's prompt (_prompt_inputs), whose window is judged against these.
            return {"input_ids": ids, **self.mask, **({"use_cache": True} if self.generates else {})}, 0
        if index != 0:
            raise ValueError(f"decode steps extend the round's one prompt (set 0), not set {index}")
        if not self.caches:
            raise ValueError("a decode step before the sample's prompt (call 0)")
        count, rest = divmod(len(item) - 1, self.batch)
        if count < 1 or rest:
            raise ValueError(f"a decode step carries a whole number of tokens per batch entry ({self.batch}), got {len(item) - 1} ids")
        new = item[1:].to(self.device).view(self.batch, count)
        assert self.cache_arg is not None
        if self.encoded:
            return {"decoder_input_ids": new, "encoder_outputs": (self.encoded[0],), self.cache_arg: self.caches[0],
                    "use_cache": True, **self.mask}, count
        # The cache holds the prompt and every token decoded since prepare; the mask covers those and
        # the step's own, where the model's generation passes one on cached steps.
        mask = self._mask(self.batch, self.seq + self.decoded + count) if self.step_mask else {}
        return {"input_ids": new, self.cache_arg: self.caches[0], "use_cache": True, **mask}, count

    def op_step(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """One timed call on the inputs this request reveals, and the commitment to its outputs.

        The parent times the request on its own clock (runners.audit.model_sample); `t0`/`t1` are
        only checked to fit inside it. The reply cannot be sent before the outputs exist: it
        carries their commitment."""
        assert self.model is not None
        call = int(header["call"])
        if call == 0:
            self.outputs = []  # a new sample
        if call != len(self.outputs):
            raise ValueError(f"call {call} announced after {len(self.outputs)} calls of this sample")
        prompt = self.phase == "decode" and call == 0
        item = _item(tensors)
        kwargs, appended = self._prompt_inputs(item) if prompt else self._call_inputs(item)
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            try:
                raw = self.model(**kwargs)
            except BaseException as exc:
                raise candidate_fault(exc, during="the prompt's prefill" if prompt else "a timed forward",
                                      code="sandbox.candidate_exception") from None
        if prompt:
            self._keep_prompt_state(raw)
        out = _logits(raw)
        self._sync()  # device-wide: work left on other streams lands inside the window
        self.decoded += appended
        _, meta = checks.inspect_outputs(out, [], expect_tuple=False)
        sums: list[torch.Tensor] = []
        if type(out) is torch.Tensor and out.dim() >= 1:
            if self.weights is None or self.weights.numel() != out.shape[-1]:
                self.weights = commit_weights(self.commit_seed, out.shape[-1]).to(out.device)
            sums = [row_commitments(out, self.weights)]
        self.outputs.append(out)
        self.next_request_soon = call < self.calls - 1
        return {"t0": t0, "t1": time.perf_counter_ns(), "meta": meta}, sums

    def op_fetch(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Rows of one timed call's output: every batch entry at the positions the parent names."""
        out = self.outputs[int(header["call"])]
        positions = torch.tensor([int(p) for p in header["positions"]], dtype=torch.long, device=out.device)
        return {}, [out.detach().index_select(-2, positions).contiguous()]

    def op_release(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.caches, self.outputs, self.weights, self.encoded = [], [], None, []
        return {}, []
