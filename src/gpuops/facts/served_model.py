"""The served model, from its Hugging Face ``config.json`` (pure).

Gates are often keyed on ``architectures[0]`` (SGLang auto-enables the allreduce fusion only for
some MoE architectures) and benchmarks size their all-reduce messages from ``hidden_size``.
Multimodal configs (Kimi-K2.5, Qwen-VL...) keep the language model's sizes in a sub-config.
"""

from __future__ import annotations

import json
from typing import TypedDict
from gpuops.frozen import frozen

_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config", "thinker_config")


@frozen
class ModelFacts:
    """The served model as its ``config.json`` describes it (the language model's sizes where the config is
    multimodal); ``known`` False, with ``reason``, when it could not be read."""

    known: bool
    path: str
    reason: str | None = None
    config_path: str | None = None
    architecture: str | None = None  # architectures[0]
    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_experts: int | None = None
    torch_dtype: str | None = None
    # config.json's `quantization_config`: its `quant_method` ("fp8"), None where there is none (the
    # weights are in torch_dtype), and its `weight_block_size` (FP8 block quantization: [128, 128]).
    quant_method: str | None = None
    weight_block_size: tuple[int, ...] | None = None


class ModelJSON(TypedDict):
    """The ``model`` key of the inspect document (``model_json``): a ``ModelFacts``, key for key."""

    known: bool
    path: str
    reason: str | None
    config_path: str | None
    architecture: str | None
    architectures: list[str]
    model_type: str | None
    hidden_size: int | None
    num_hidden_layers: int | None
    num_attention_heads: int | None
    num_experts: int | None
    torch_dtype: str | None
    quant_method: str | None
    weight_block_size: list[int] | None


def _find(config: dict[str, object], key: str) -> object:
    if key in config:
        return config[key]
    for sub in _TEXT_CONFIG_KEYS:
        inner = config.get(sub)
        if isinstance(inner, dict) and key in inner:
            return inner[key]
    return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_from_config(path: str, config_path: str | None, config: bytes | None, error: str | None = None) -> ModelFacts:
    if config is None:
        return ModelFacts(known=False, path=path, reason=error or "the model's config.json was not read")
    try:
        data: object = json.loads(config.decode("utf-8", errors="replace"))
    except ValueError as exc:
        return ModelFacts(known=False, path=path, config_path=config_path, reason=f"config.json is not valid JSON: {exc}")
    if not isinstance(data, dict):
        return ModelFacts(known=False, path=path, config_path=config_path, reason="config.json is not a JSON object")
    listed = data.get("architectures") or []
    architectures = tuple(a for a in (listed if isinstance(listed, list) else []) if isinstance(a, str))
    experts = _find(data, "n_routed_experts") or _find(data, "num_experts") or _find(data, "num_local_experts")
    dtype = _find(data, "torch_dtype") or _find(data, "dtype")
    found = _find(data, "quantization_config")
    quant = found if isinstance(found, dict) else {}
    block = quant.get("weight_block_size")
    return ModelFacts(
        known=True,
        path=path,
        config_path=config_path,
        architecture=architectures[0] if architectures else None,
        architectures=architectures,
        model_type=model_type if isinstance(model_type := data.get("model_type"), str) else None,
        hidden_size=_int(_find(data, "hidden_size")),
        num_hidden_layers=_int(_find(data, "num_hidden_layers")),
        num_attention_heads=_int(_find(data, "num_attention_heads")),
        num_experts=_int(experts),
        torch_dtype=dtype if isinstance(dtype, str) else None,
        quant_method=str(quant["quant_method"]) if quant.get("quant_method") else None,
        weight_block_size=_block_size(block),
    )


def _block_size(block: object) -> tuple[int, ...] | None:
    """``weight_block_size`` when it is a list of non-zero integers ([128, 128])."""
    if not isinstance(block, list):
        return None
    sizes = [_int(b) for b in block]
    return tuple(n for n in sizes if n) if all(sizes) else None


def model_json(model: ModelFacts | None) -> ModelJSON | None:
    """The ``model`` key of the inspect document (docs/inspect-json.md)."""
    if model is None:
        return None
    return ModelJSON(
        known=model.known, path=model.path, reason=model.reason, config_path=model.config_path,
        architecture=model.architecture, architectures=list(model.architectures), model_type=model.model_type,
        hidden_size=model.hidden_size, num_hidden_layers=model.num_hidden_layers,
        num_attention_heads=model.num_attention_heads, num_experts=model.num_experts, torch_dtype=model.torch_dtype,
        quant_method=model.quant_method,
        weight_block_size=list(model.weight_block_size) if model.weight_block_size is not None else None,
    )
