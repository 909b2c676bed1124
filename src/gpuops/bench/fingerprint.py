"""The configuration fingerprint of a result: what was measured, as a stable hash (pure).

Two results with the same fingerprint ran the same configuration: the same server flags (less the
ones that only say where it listens), the same tuning environment, the same SGLang version and the
same patched gates. The hash is over canonical JSON, so key order never changes it.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Iterable, Mapping, TypedDict

from gpuops.bench.record import Configuration, ServerRecord
from gpuops.secret_policy import is_secret_name, mask_args, mask_mapping, mask_value

# Flags that say where or how the server is reached, not how fast it runs.
VOLATILE_SERVER_ARGS = frozenset({
    "host", "port", "random_seed", "api_key", "admin_api_key", "log_level", "log_level_http",
    "log_requests", "log_requests_level", "enable_metrics", "bucket_time_to_first_token",
    "file_storage_path", "decrypted_config_file", "decrypted_draft_config_file", "nccl_port",
    "dist_init_addr", "served_model_name",
})
# Environment our own stand-in uses to simulate; never part of a real configuration.
_SIMULATION_ENV_PREFIX = "GPUOPS_STANDIN_"


class ConfigDifference(TypedDict):
    """One thing two configurations differ in (``section``: server_args | env | extra | sglang | gates)."""

    section: str
    key: str
    a: object
    b: object


def tuning_env(env: Mapping[str, object] | None) -> dict[str, str]:
    """The environment that can change performance: less simulator controls and less credentials
    (named by the one secrets policy: ``HF_TOKEN`` goes, ``SGLANG_KEY_CACHE`` stays), so rotating a
    token never changes a fingerprint. Other values have URL credentials masked."""

    return {str(key): str(mask_value(str(key), value)) for key, value in sorted((env or {}).items())
            if not str(key).startswith(_SIMULATION_ENV_PREFIX) and not is_secret_name(str(key))}


def shown_env(env: Mapping[str, object] | None) -> dict[str, str]:
    """The environment as a result stores it: every variable, secret values masked (short hash)."""

    return {str(key): str(mask_value(str(key), value)) for key, value in sorted((env or {}).items())
            if not str(key).startswith(_SIMULATION_ENV_PREFIX)}


def stable_server_args(server_args: Mapping[str, object] | None) -> dict[str, object]:
    return mask_mapping({k: v for k, v in sorted((server_args or {}).items()) if k not in VOLATILE_SERVER_ARGS})


def public_server_record(record: ServerRecord) -> ServerRecord:
    """A result's ``server`` record as it may be stored and shown: flags, environment and the
    process command line with secret values masked (real SGLang reports ``api_key`` in its info)."""

    out = record.copy()
    out["server_args"] = mask_mapping(dict(record.get("server_args") or {}))
    out["env"] = shown_env(record.get("env"))
    argv = record.get("process_cmdline")
    if isinstance(argv, list):
        out["process_cmdline"] = mask_args(argv)
    elif isinstance(argv, str):
        out["process_cmdline"] = " ".join(mask_args(shlex.split(argv)))
    return out


def configuration(
    server_args: Mapping[str, object] | None,
    env: Mapping[str, object] | None,
    sglang_version: object,
    patched_gates: Iterable[str] = (),
    extra: Mapping[str, object] | None = None,
) -> Configuration:
    """The inputs of the fingerprint, kept in the result so a diff can say what differs."""
    config: Configuration = {
        "server_args": stable_server_args(server_args),
        "env": tuning_env(env),
        "sglang_version": sglang_version,
        "patched_gates": sorted(set(patched_gates)),
    }
    if extra:
        config["extra"] = dict(sorted(extra.items()))
    return config


def fingerprint(config: Configuration) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def config_differences(a: Configuration, b: Configuration) -> list[ConfigDifference]:
    """Each difference between two configurations: section, key, value in a, value in b."""
    diffs: list[ConfigDifference] = []
    sections: tuple[tuple[str, Mapping[str, object] | None, Mapping[str, object] | None], ...] = (
        ("server_args", a.get("server_args"), b.get("server_args")), ("env", a.get("env"), b.get("env")),
        ("extra", a.get("extra"), b.get("extra")))
    for section, left_part, right_part in sections:
        left, right = left_part or {}, right_part or {}
        for key in sorted(set(left) | set(right)):
            if left.get(key) != right.get(key):
                diffs.append({"section": section, "key": key, "a": left.get(key), "b": right.get(key)})
    if a.get("sglang_version") != b.get("sglang_version"):
        diffs.append({"section": "sglang", "key": "version", "a": a.get("sglang_version"),
                      "b": b.get("sglang_version")})
    left_gates, right_gates = set(a.get("patched_gates") or []), set(b.get("patched_gates") or [])
    for gate in sorted(left_gates ^ right_gates):
        diffs.append({"section": "gates", "key": gate, "a": "patched" if gate in left_gates else "-",
                      "b": "patched" if gate in right_gates else "-"})
    return diffs
