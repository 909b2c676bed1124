"""The one secrets policy, as home code imports it: which names hold secrets, and how a secret is
shown (masked, with a short hash so two configurations can still be told apart). Used by inspect
(server flags and environment), apply (diffs, errors, log tails, journal), bench (results,
fingerprint) and report.

The policy itself lives in ``gpuops.remote.secret_mask`` (its docstring says what counts as a
secret), so the host's bench client masks the frames it writes with the very same rules.
"""

from __future__ import annotations

from gpuops.remote.secret_mask import (
    SecretText,
    command_line_secrets,
    is_masked,
    is_secret_name,
    mask,
    mask_args,
    mask_env,
    mask_mapping,
    mask_reported,
    mask_text,
    mask_url_credentials,
    mask_value,
    reported_secrets,
    secret_values,
    short_hash,
)

__all__ = ["SecretText", "command_line_secrets", "is_masked", "is_secret_name", "mask", "mask_args", "mask_env",
           "mask_mapping", "mask_reported", "mask_text", "mask_url_credentials", "mask_value", "reported_secrets",
           "secret_values", "short_hash"]
