"""The one secrets policy: which names hold secrets, and how a secret is shown (masked, with a
short hash so two configurations can still be told apart). Used by inspect (server flags and
environment), apply (diffs, errors, log tails, journal), bench (results, fingerprint) and report.

Secret:
- a launch flag, variable or environment name whose words (split on ``-``/``_``) contain
  ``secret``, ``password``/``passwd``/``pass`` (last word), ``credential(s)``, or END with
  ``token`` or ``key`` (``--api-key``, ``--admin-api-key``, ``HF_TOKEN``, ``AWS_ACCESS_KEY``), and
  names containing ``apikey``/``api_key``. Not: ``max_total_tokens`` (a count), ``--tokenizer-path``,
  ``SGLANG_KEY_CACHE`` or ``--speculative-token-map`` (the word is not last: a setting, not a
  credential), ``ansible_ssh_private_key_file`` (a path);
- the credentials inside a URL (``https://user:pass@host``, ``https://TOKEN@host``).

Secrets inside values that a server, a host or a process reports (``mask_reported``): the values
under secret names at any depth, the value of a secret flag inside a command line held as a string
(``launch_command``, ``cmd``, a unit's ``ExecStart``: ``--api-key K``, ``--api-key=K``, ``HF_TOKEN=K``)
or as a list of words under any key, URL credentials; and then each secret so found wherever else it
appears in the same document (an error message that quotes it).

Masked form: ``<masked:1a2b3c4d>``, the first 8 hex digits of the value's sha256 (32 bits: enough
to tell two values apart in a diff, too few to look a strong secret up).

A value of ``SecretText`` (a vault's decrypted value, ``inventory/vault.VaultText``) is a secret
whatever its name.

Both sides use this one module (stdlib only, Python 3.8+): home through ``gpuops.secret_policy``,
the host's bench client on every frame it writes (``bench_frames.Emitter``: stdout and the host's
own frames file), so a secret the host reads never reaches a file unmasked on either side.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable, Mapping, Sequence

_ANYWHERE = {"secret", "secrets", "password", "passwd", "credential", "credentials", "apikey", "passphrase"}
_LAST = {"token", "key", "pass", "pw", "pwd"}
_NOT_SECRET_LAST = {"file", "path", "dir", "id", "ids", "name", "names", "type", "size", "len", "length"}
_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^\s/@'\"]+)@")
_MASKED = re.compile(r"<masked:[0-9a-f]{8}>")
_MIN_LENGTH = 4  # masking "1" would mask every digit in a diff


def short_hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:8]


def mask(value: Any) -> str:
    return f"<masked:{short_hash(str(value))}>"


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[-_.\s]+", name.strip().lstrip("-").lower()) if w]


def is_secret_name(name: str) -> bool:
    """``--api-key``, ``api_key``, ``HF_TOKEN``, ``SGLANG_ADMIN_PASSWORD`` -> True;
    ``max_total_tokens``, ``SGLANG_KEY_CACHE``, ``ssh_private_key_file`` -> False."""
    words = _words(name.split("=", 1)[0])
    if not words:
        return False
    joined = "_".join(words)
    if "api_key" in joined and words[-1] not in _NOT_SECRET_LAST:
        return True
    if words[-1] in _NOT_SECRET_LAST:
        return False
    return bool(_ANYWHERE & set(words)) or words[-1] in _LAST


class SecretText(str):
    """Text known to be a secret whatever name it is under (a vault's decrypted value)."""

    __slots__ = ()


def _from_vault(value: Any) -> bool:
    return isinstance(value, SecretText)


def mask_url_credentials(text: str) -> str:
    def one(match: "re.Match[str]") -> str:
        cred = match.group("cred")
        return match.group("scheme") + (cred if _MASKED.fullmatch(cred) else mask(cred)) + "@"

    return _URL_CREDENTIALS.sub(one, text)


def mask_value(name: str, value: Any) -> Any:
    """``value`` as it may be shown under ``name``: masked when the name is secret; URL credentials
    masked in any text; ``True``/``None``/empty left alone (a switch, or nothing to hide)."""
    if value is None or isinstance(value, bool) or value == "":
        return value
    if isinstance(value, Mapping):
        return mask_mapping(value)
    if isinstance(value, (list, tuple)):
        return [mask_value(name, v) for v in value]
    if is_secret_name(name) or _from_vault(value):
        return mask(value)
    return mask_url_credentials(value) if isinstance(value, str) else value


def mask_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """Variables, environments, parsed server flags: every secret-named value masked, at any depth."""
    return {str(k): mask_value(str(k), v) for k, v in values.items()}


def mask_env(env: Mapping[str, Any]) -> dict[str, Any]:
    return mask_mapping(env)


def mask_args(args: Sequence[Any]) -> list[str]:
    """Launch words: the value after (or ``=`` of) a secret flag masked, URL credentials masked."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        word = str(arg)
        if hide_next and not word.startswith("--"):
            out.append(mask(word))
            hide_next = False
            continue
        hide_next = False
        if word.startswith("--") and is_secret_name(word):
            name, eq, value = word.partition("=")
            if eq:
                out.append(f"{name}={mask(value)}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(mask_url_credentials(word))
    return out


def secret_values(*sources: Any) -> list[str]:
    """Every secret value found in variables, environments and launch words, at any depth: what
    ``mask_text`` must hide in free text (diffs, log tails, errors). Longest first."""
    found: set[str] = set()

    def add(value: Any) -> None:
        if value is None or isinstance(value, bool):
            return
        text = str(value)
        if len(text) >= _MIN_LENGTH:
            found.add(text)

    def walk(name: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(str(key), inner)
        elif isinstance(value, (list, tuple)):
            words = [str(v) for v in value]
            for i, word in enumerate(words):
                if isinstance(value[i], (Mapping, list, tuple)):
                    walk(name, value[i])
                    continue
                if word.startswith("--") and is_secret_name(word):
                    _, eq, inline = word.partition("=")
                    if eq:
                        add(inline)
                    elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                        add(words[i + 1])
                elif is_secret_name(name) or _from_vault(value[i]):
                    add(word)
                for match in _URL_CREDENTIALS.finditer(word):
                    add(match.group("cred"))
        else:
            if is_secret_name(name) or _from_vault(value):
                add(value)
            if isinstance(value, str):
                for match in _URL_CREDENTIALS.finditer(value):
                    add(match.group("cred"))

    for source in sources:
        if isinstance(source, Mapping):
            for key, value in source.items():
                walk(str(key), value)
        else:
            walk("", source)
    return sorted(found, key=len, reverse=True)


def mask_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Free text (a diff, a log tail, an error): each known secret value masked, and URL credentials."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, mask(secret))
    return mask_url_credentials(text)


_FLAG_IN_TEXT = re.compile(r"(?<![\w-])(?P<flag>--[A-Za-z0-9][A-Za-z0-9_.-]*)(?P<sep>=|[ \t]+)"
                           r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\"]+)")
# An unquoted value ends at a bracket too: ``server_args=ServerArgs(api_key='K', ...)``, as SGLang
# logs its arguments, is two assignments, not one whose value swallows the second's name.
_ASSIGN_IN_TEXT = re.compile(r"(?<![\w.-])(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\",()]+)")


def _unquoted(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def command_line_secrets(text: str) -> list[str]:
    """The values of secret flags (``--api-key K``, ``--api-key=K``) and secret assignments
    (``HF_TOKEN=K``, ``api_key='K'``) inside one string."""
    found = []
    for match in _FLAG_IN_TEXT.finditer(text):
        value = _unquoted(match.group("value"))
        if is_secret_name(match.group("flag")) and not value.startswith("--") and not _MASKED.fullmatch(value):
            found.append(value)
    for match in _ASSIGN_IN_TEXT.finditer(text):
        value = _unquoted(match.group("value"))
        if is_secret_name(match.group("name")) and not _MASKED.fullmatch(value):
            found.append(value)
    return [v for v in found if len(v) >= _MIN_LENGTH]


def _reported_secrets(value: Any, found: set[str]) -> None:
    if isinstance(value, Mapping):
        for inner in value.values():
            _reported_secrets(inner, found)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            _reported_secrets(inner, found)
    elif isinstance(value, str):
        found.update(command_line_secrets(value))


def reported_secrets(*documents: Any) -> list[str]:
    """Every secret in what a server, host or process reported (longest first): under secret names,
    after secret flags in argv lists and in command-line strings, in URLs."""
    found = set(secret_values(*documents))
    for document in documents:
        _reported_secrets(document, found)
    return sorted((s for s in found if not _MASKED.fullmatch(s)), key=len, reverse=True)


def _mask_reported(name: str, value: Any, secrets: Sequence[str]) -> Any:
    if value is None or isinstance(value, bool) or value == "":
        return value
    if isinstance(value, Mapping):
        return {str(k): _mask_reported(str(k), v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, str) and v.startswith("--") for v in value) and all(isinstance(v, str) for v in value):
            value = mask_args(value)  # argv under any key
        return [_mask_reported(name, v, secrets) for v in value]
    if is_secret_name(name) or _from_vault(value):
        return value if isinstance(value, str) and _MASKED.fullmatch(value) else mask(value)
    if isinstance(value, str):
        return mask_text(value, secrets)
    return value


def mask_reported(document: Any, also: Iterable[str] = ()) -> Any:
    """``document`` (JSON-like: what a server, host or process reported) with every secret in it
    masked, wherever it appears (see the module's docstring); ``also``: secrets known from elsewhere."""
    secrets = sorted(set(reported_secrets(document)) | {s for s in also if s and len(s) >= _MIN_LENGTH},
                     key=len, reverse=True)
    return _mask_reported("", document, secrets)


def is_masked(text: str) -> bool:
    return bool(_MASKED.fullmatch(text))


__all__ = ["SecretText", "command_line_secrets", "is_secret_name", "mask", "mask_args", "mask_env", "mask_mapping", "mask_reported",
           "mask_text", "mask_url_credentials", "mask_value", "reported_secrets", "secret_values", "short_hash"]
