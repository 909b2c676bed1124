"""Which SSH algorithms paramiko offers first: fast ones, unless ~/.ssh/config says otherwise.

paramiko's own cipher order starts with AES-CTR, whose every packet then also needs an HMAC, and
keeps CBC and 3DES ahead of AES-GCM. gpuops offers AES-GCM first (one AEAD pass per packet, done
by OpenSSL), then CTR; CBC and 3DES stay last, for old servers only. Key exchange keeps paramiko's
order (the ML-KEM hybrid and curve25519 first, both computed by OpenSSL; the finite-field
Diffie-Hellman groups last) and host keys ed25519 first (paramiko also moves a key type already
in known_hosts to the front). ChaCha20-Poly1305 is not offered: paramiko does not implement it.

``~/.ssh/config``'s ``Ciphers``, ``KexAlgorithms``, ``HostKeyAlgorithms`` and ``MACs`` win, read as
OpenSSH reads them: a list replaces the order, ``+list`` appends, ``-list`` removes (wildcards
allowed), ``^list`` puts first. Names paramiko does not implement are left out; a setting that
leaves nothing paramiko can speak fails the host with one line naming it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

# ssh_config keyword (lower case, as paramiko's SSHConfig gives it) -> the field of paramiko's
# SecurityOptions (``Transport.get_security_options()``, its public way to order algorithms) it sets
CONFIG_KEYWORDS = {
    "kexalgorithms": "kex",
    "ciphers": "ciphers",
    "macs": "digests",
    "hostkeyalgorithms": "key_types",
}
# OpenSSH's names for algorithms paramiko knows under another
ALIASES = {"curve25519-sha256": "curve25519-sha256@libssh.org"}
FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr")
FAST_MACS = ("hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com", "hmac-sha2-256", "hmac-sha2-512")


class AlgorithmError(ValueError):
    """A config setting leaves no algorithm paramiko implements."""


def fast_first(default: Sequence[str], fast: Sequence[str]) -> tuple[str, ...]:
    """``default`` reordered: the ``fast`` names it holds first (in fast's order), the rest after."""
    return tuple([n for n in fast if n in default] + [n for n in default if n not in fast])


def apply_config(current: Sequence[str], spec: str, supported: Sequence[str], keyword: str) -> tuple[str, ...]:
    """OpenSSH's reading of an algorithm list setting, over ``current``, kept to ``supported``."""
    spec = spec.strip()
    if not spec:
        return tuple(current)
    head, body = spec[0], spec[1:] if spec[0] in "+-^" else spec
    names = [ALIASES.get(n.strip(), n.strip()) for n in body.split(",") if n.strip()]
    if head == "-":
        result = [n for n in current if not any(fnmatch.fnmatchcase(n, pattern) for pattern in names)]
    else:
        wanted = [n for pattern in names for n in (_matching(pattern, supported))]
        wanted = list(dict.fromkeys(wanted))
        if head == "+":
            result = list(current) + [n for n in wanted if n not in current]
        elif head == "^":
            result = wanted + [n for n in current if n not in wanted]
        else:
            result = wanted
    if not result:
        raise AlgorithmError(f"ssh config {keyword} {spec!r} leaves no algorithm paramiko supports "
                             f"(it has: {', '.join(supported)}); use --connection openssh for others")
    return tuple(result)


def _matching(pattern: str, supported: Sequence[str]) -> list[str]:
    if any(c in pattern for c in "*?"):
        return [n for n in supported if fnmatch.fnmatchcase(n, pattern)]
    return [pattern] if pattern in supported else []


def preferences(offered: Mapping[str, Sequence[str]], ssh_config: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The SecurityOptions fields to set for this host's config, from paramiko's own ``offered`` order
    of each (``kex``, ``ciphers``, ``digests``, ``key_types``): what it offers is what it implements,
    host key types also as certificates (paramiko offers a ``-cert-v01@openssh.com`` form of each)."""
    result: dict[str, tuple[str, ...]] = {
        "ciphers": fast_first(offered["ciphers"], FAST_CIPHERS),
        "digests": fast_first(offered["digests"], FAST_MACS),
    }
    for keyword, field in CONFIG_KEYWORDS.items():
        value = ssh_config.get(keyword)
        if not value:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        supported = tuple(offered[field])
        if field == "key_types":
            supported += tuple(f"{name}-cert-v01@openssh.com" for name in supported if "-cert-v01@" not in name)
        current = result.get(field, tuple(offered[field]))
        result[field] = apply_config(current, str(value), supported, keyword)
    return result


def order_algorithms(transport: Any, ssh_config: Mapping[str, Any]) -> None:
    """Set a paramiko Transport's algorithm order (before it starts) through its SecurityOptions."""
    options = transport.get_security_options()
    offered = {field: tuple(getattr(options, field)) for field in CONFIG_KEYWORDS.values()}
    for field, order in preferences(offered, ssh_config).items():
        setattr(options, field, order)
