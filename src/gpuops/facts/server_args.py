"""An SGLang server's command line, parsed into its flags (pure).

All flags are kept (``args``, keyed by the flag name with dashes as underscores, as SGLang's
``ServerArgs`` names them), and the ones gpuops reasons about get typed fields. Values of flags that
look like credentials (``--api-key``, ``--hf-token``...) are masked here (gpuops.secret_policy,
the one policy), before anything could print or journal them.
"""

from __future__ import annotations

from dataclasses import field
from typing import TypedDict

# The one SGLang argv parser (stdlib only, shared with the host code and the lab's stand-in).
from gpuops.remote.sglang_argv import DEFAULT_PORT, first_of, launch_args, parse_flags
from gpuops.secret_policy import mask_mapping
from gpuops.frozen import frozen


# A flag's value as parse_flags gives it: text, True for a bare flag, a list of words for nargs.
Flags = dict[str, object]


class SpeculativeFlags(TypedDict):
    """The speculative launch flags, as given (``--speculative-algorithm`` and its numbers)."""

    algorithm: object
    draft_model_path: object
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None


def redact(flags: Flags) -> Flags:
    return mask_mapping(flags)


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off", "")
    return bool(value)


@frozen
class ServerSettings:
    """The typed view of a server's flags; ``args`` keeps every flag as given."""

    args: Flags
    positional: tuple[str, ...] = ()
    model_path: str | None = None
    port: int = DEFAULT_PORT
    host: str | None = None
    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    pp_size: int = 1
    speculative: SpeculativeFlags | None = None
    fusion_flags: Flags = field(default_factory=dict)  # every flag naming a fusion
    enable_flashinfer_allreduce_fusion: bool = False
    disable_custom_all_reduce: bool = False
    attention_backend: str | None = None
    quantization: str | None = None
    trust_remote_code: bool = False


def settings_from_argv(argv: list[str]) -> ServerSettings:
    words = launch_args(argv)
    flags, positional = parse_flags(words if words is not None else [])
    flags = redact(flags)

    spec_algorithm = flags.get("speculative_algorithm")
    speculative: SpeculativeFlags | None = None
    if spec_algorithm not in (None, True) and str(spec_algorithm).upper() != "NONE":
        speculative = {
            "algorithm": spec_algorithm,
            "draft_model_path": flags.get("speculative_draft_model_path"),
            "num_steps": _int(flags.get("speculative_num_steps")),
            "eagle_topk": _int(flags.get("speculative_eagle_topk")),
            "num_draft_tokens": _int(flags.get("speculative_num_draft_tokens")),
        }
    model = first_of(flags, "model_path")
    if model is None and positional:
        model = positional[0]  # `sglang serve MODEL`
    return ServerSettings(
        args=flags,
        positional=tuple(positional),
        model_path=model if isinstance(model, str) else None,
        port=_int(flags.get("port")) or DEFAULT_PORT,
        host=host if isinstance(host := flags.get("host"), str) else None,
        tp_size=_int(first_of(flags, "tp_size")) or 1,
        dp_size=_int(first_of(flags, "dp_size")) or 1,
        ep_size=_int(first_of(flags, "ep_size")) or 1,
        pp_size=_int(first_of(flags, "pp_size")) or 1,
        speculative=speculative,
        fusion_flags={k: v for k, v in flags.items() if "fusion" in k or "fuse" in k},
        enable_flashinfer_allreduce_fusion=_bool(flags.get("enable_flashinfer_allreduce_fusion", False)),
        disable_custom_all_reduce=_bool(flags.get("disable_custom_all_reduce", False)),
        attention_backend=backend if isinstance(backend := flags.get("attention_backend"), str) else None,
        quantization=quantization if isinstance(quantization := flags.get("quantization"), str) else None,
        trust_remote_code=_bool(flags.get("trust_remote_code", False)),
    )
