"""Turning an uploaded model folder into the `torch.nn.Module` that transformers would run by default.

One home for the rules on what counts as a supported model (known `model_type`, a transformers class,
no custom code): upload validation (platform/catalog/validation.py) and the runners both use them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Nothing here may reach the network: a model folder is loaded from disk or not at all. Set before
# transformers (and huggingface_hub, which reads it at import) is imported anywhere in the process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

CONFIG_NAME = "config.json"
SINGLE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# A config that asks for more layers than any published model is either a mistake or an attempt
# to make even a meta-device instantiation (one Python module per layer) run for minutes.
MAX_LAYERS = 1024
# Any integer under a key naming a count of layers, at any depth (a bart card's encoder_layers and
# decoder_layers, a multimodal card's text_config.num_hidden_layers), whatever the architecture.
_LAYER_KEY = re.compile(r"(^|_)(n_|num_)?([a-z]+_)?layers?$")


def layer_counts(data: Mapping[str, Any], prefix: str = "", depth: int = 0) -> list[tuple[str, int]]:
    """(dotted key, value) of every layer count in a config, nested configs included."""
    found: list[tuple[str, int]] = []
    if depth > 16:  # configs nest two or three levels; deeper is not a config
        raise UnsupportedModel("invalid_config", "config.json nests more than 16 levels; it is not a model config.")
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found += layer_counts(value, f"{path}.", depth + 1)
        elif isinstance(value, int) and not isinstance(value, bool) and _LAYER_KEY.search(str(key).lower()):
            found.append((path, max(0, value)))
    return found


class UnsupportedModel(ValueError):
    """A model folder transformers cannot run safely as is. `code` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def config_from_dict(data: Mapping[str, Any]) -> transformers.PretrainedConfig:
    """Build the transformers config for an uploaded config.json, refusing anything needing custom code.

    Raises UnsupportedModel with code `custom_code`, `missing_model_type`, `unknown_architecture` or
    `invalid_config`.
    """
    if "auto_map" in data:
        raise UnsupportedModel(
            "custom_code",
            "config.json has an `auto_map`, i.e. the model needs its own Python code "
            "(trust_remote_code), which Dyno never runs. Upload a model whose architecture ships "
            "with transformers, or remove `auto_map` if the model_type is a standard one.",
        )
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UnsupportedModel(
            "missing_model_type",
            "config.json has no `model_type`, so the architecture cannot be recognised. Save the "
            "config with transformers (`config.save_pretrained(folder)`), which writes it.",
        )
    mapping = transformers.CONFIG_MAPPING
    if model_type not in mapping:
        raise UnsupportedModel(
            "unknown_architecture",
            f"model_type {model_type!r} is not an architecture that transformers "
            f"{transformers.__version__} knows without custom code. Supported examples: llama, "
            "mistral, qwen2, mixtral, gpt2, bert, mamba.",
        )
    counts = layer_counts(data)
    total = sum(value for _, value in counts)
    if total > MAX_LAYERS:
        named = ", ".join(f"{path}={value}" for path, value in counts if value)[:300]
        raise UnsupportedModel(
            "invalid_config",
            f"config.json asks for {total} layers in all ({named}); more than {MAX_LAYERS} layers is not "
            "a model Dyno can profile. Check the values.",
        )
    try:
        return mapping[model_type].from_dict(dict(data))
    except Exception as exc:  # transformers raises TypeError/ValueError and hub validation errors
        detail = " ".join(str(exc).split())
        raise UnsupportedModel(
            "invalid_config",
            f"config.json is not a valid {model_type} config: {detail}. Fix the value or re-save "
            "the config with transformers.",
        ) from exc


def read_config(model_dir: Path) -> transformers.PretrainedConfig:
    """The config of a model folder, read from its config.json only (never the hub)."""
    path = Path(model_dir) / CONFIG_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UnsupportedModel("missing_config", f"{path} does not exist") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModel("invalid_json", f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnsupportedModel("invalid_json", f"{path} must hold a JSON object")
    return config_from_dict(data)


def resolve_model_class(config: transformers.PretrainedConfig) -> type[transformers.PreTrainedModel]:
    """The transformers class that runs this config: its `architectures[0]`, else the causal-LM or
    base class registered for its type.

    Raises UnsupportedModel(`unknown_architecture`) for a name transformers does not ship or one that
    belongs to another model_type.
    """
    names = getattr(config, "architectures", None) or []
    if names:
        name = names[0]
        model_class: Any = None
        if isinstance(name, str) and name.isidentifier():
            try:
                model_class = getattr(transformers, name, None)
            except Exception:  # a lazily imported class whose optional dependency is missing
                model_class = None
        if not (isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel)):
            raise UnsupportedModel(
                "unknown_architecture",
                f"architecture {name!r} in config.json is not a model class of transformers "
                f"{transformers.__version__}; custom model code is not run. Use a standard class "
                f"(for {config.model_type}: e.g. {_default_class_name(config) or 'its ...ForCausalLM'}).",
            )
        expected = getattr(model_class, "config_class", None)
        if expected is not None and not isinstance(config, expected):
            raise UnsupportedModel(
                "unknown_architecture",
                f"architecture {name!r} belongs to model_type {expected.model_type!r}, but config.json "
                f"says {config.model_type!r}. Make the two agree.",
            )
        return model_class
    for mapping in (transformers.MODEL_FOR_CAUSAL_LM_MAPPING, transformers.MODEL_MAPPING):
        if type(config) in mapping:
            return mapping[type(config)]
    raise UnsupportedModel(
        "unknown_architecture",
        f"config.json names no `architectures` and transformers has no default model for "
        f"{config.model_type!r}. Add the model class name, e.g. \"architectures\": [\"...\"].",
    )


def _default_class_name(config: transformers.PretrainedConfig) -> str | None:
    for mapping in (transformers.MODEL_FOR_CAUSAL_LM_MAPPING, transformers.MODEL_MAPPING):
        if type(config) in mapping:
            return mapping[type(config)].__name__
    return None


def config_dtype(config: transformers.PretrainedConfig) -> torch.dtype:
    """The dtype the config declares (`dtype`, or `torch_dtype` in transformers 4.x), float32 if none."""
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(declared, torch.dtype):
        return declared
    if isinstance(declared, str) and isinstance(getattr(torch, declared, None), torch.dtype):
        return getattr(torch, declared)
    return torch.float32


def build_on_meta(config: transformers.PretrainedConfig) -> torch.nn.Module:
    """The model's module tree on the `meta` device: every shape, no memory, no initialisation cost."""
    model_class = resolve_model_class(config)
    with torch.device("meta"):
        return model_class._from_config(config, dtype=config_dtype(config))


def decoder_inputs(config: transformers.PretrainedConfig, *, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    """What an encoder-decoder model's forward needs beside the prompt: the decoder's start token,
    one per batch entry (a prefill is the encoder over the prompt and the decoder's first step).
    Nothing for a decoder-only or encoder-only model."""
    if not getattr(config, "is_encoder_decoder", False):
        return {}
    start = next((v for v in (getattr(config, "decoder_start_token_id", None), getattr(config, "pad_token_id", None))
                  if isinstance(v, int) and not isinstance(v, bool)), 0)
    return {"decoder_input_ids": torch.full((batch, 1), start, dtype=torch.long, device=device)}


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights counted once, as `parameters()` deduplicates them)."""
    return sum(p.numel() for p in model.parameters())


def has_weights(model_dir: Path) -> bool:
    model_dir = Path(model_dir)
    return (model_dir / SINGLE_WEIGHTS_NAME).is_file() or (model_dir / WEIGHTS_INDEX_NAME).is_file()


def parse_dtype(name: str) -> torch.dtype:
    """`"bfloat16"` / `"bf16"` / `"torch.float16"` -> the torch dtype; ValueError says what is accepted."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    key = name.removeprefix("torch.")
    key = aliases.get(key, key)
    value = getattr(torch, key, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"unknown dtype {name!r}; use float32, bfloat16 or float16")
    return value


def load_model(
    model_dir: Path, *, device: str = "cpu", dtype: str | None = None, seed: int = 0
) -> tuple[torch.nn.Module, transformers.PretrainedConfig]:
    """Load a validated model folder the way transformers runs it by default, in eval mode.

    With weights (model.safetensors or a sharded index): `from_pretrained` from the folder only
    (local_files_only, use_safetensors, trust_remote_code=False), in the checkpoint's dtype unless
    `dtype` says otherwise. An architecture card (config only) gets random weights from the
    transformers initialisers under `seed`, so the same card always gives the same model.
    """
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    model_class = resolve_model_class(config)
    torch_dtype = parse_dtype(dtype) if dtype else None
    if has_weights(model_dir):
        model = model_class.from_pretrained(
            model_dir,
            config=config,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            dtype=torch_dtype or "auto",
        )
        model = model.to(device)
    else:
        # Initialising on the target device avoids materialising a large card twice; fork_rng keeps
        # the caller's RNG stream as it was.
        devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.device(device):
            torch.manual_seed(seed)
            model = model_class._from_config(config, dtype=torch_dtype or config_dtype(config))
    model.eval()
    return model, model.config
