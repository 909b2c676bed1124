"""known_hosts as OpenSSH reads it, for paramiko: plain and hashed entries, ``@revoked``, ``@cert-authority``.

paramiko's own reader stops with ``InvalidHostKey`` at the first marker line, and knows neither
marker. Here every line is read: plain entries (hashed names included) go to paramiko's
``HostKeys``; ``@revoked`` keys are refused whoever presents them; ``@cert-authority`` lines let a
host prove itself with an OpenSSH host certificate (PROTOCOL.certkeys) signed by that CA, which
is checked in full: the CA's signature, certificate type (host), the host name among the
principals, the validity window, no critical options, and neither the host key nor the CA revoked.

The checks run inside the key exchange (``CheckingTransport``), before any authentication is
sent, so a revoked or badly certified host never sees a password or a key signature.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuops.transport.tcp_tuning import tuned
from gpuops.transport.algorithms import order_algorithms
from gpuops.frozen import frozen

CERT_HOST = 2
_KEY_FIELDS = {  # the public-key fields after the nonce, per certificate type (all length-prefixed)
    "ssh-ed25519-cert-v01@openssh.com": 1,
    "ecdsa-sha2-nistp256-cert-v01@openssh.com": 2,
    "ecdsa-sha2-nistp384-cert-v01@openssh.com": 2,
    "ecdsa-sha2-nistp521-cert-v01@openssh.com": 2,
    "ssh-rsa-cert-v01@openssh.com": 2,
    "rsa-sha2-256-cert-v01@openssh.com": 2,
    "rsa-sha2-512-cert-v01@openssh.com": 2,
}


@frozen
class MarkedKey:
    """A key from a known_hosts marker line (``@revoked`` or ``@cert-authority``): the host patterns it is for,
    its key, and the file:line it was read from."""

    patterns: tuple[str, ...]
    key_type: str
    blob: bytes
    where: str  # file:line


@dataclass
class KnownHosts:
    """What the known_hosts files say beyond plain keys (those go to paramiko's HostKeys)."""

    authorities: list[MarkedKey] = field(default_factory=list)
    revoked: list[MarkedKey] = field(default_factory=list)

    def authorities_for(self, name: str) -> list[MarkedKey]:
        return [ca for ca in self.authorities if matches(name, ca.patterns)]

    def revoked_entry(self, blob: bytes) -> MarkedKey | None:
        return next((entry for entry in self.revoked if entry.blob == blob), None)


def load(path: Path, host_keys: Any, known: KnownHosts) -> None:
    """Read one known_hosts file: plain entries into paramiko's `host_keys`, markers into `known`.

    A line paramiko cannot use (a key type it does not know, a damaged line) is skipped, as
    OpenSSH skips it; it can only ever fail to vouch for a host, never vouch wrongly.
    """
    from paramiko.hostkeys import HostKeyEntry

    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@"):
                _marker(line, f"{path}:{number}", known)
                continue
            try:
                entry = HostKeyEntry.from_line(line, number)
            except Exception:  # InvalidHostKey is not an SSHException: a bad line must not stop the file
                continue
            if entry is not None:
                for name in entry.hostnames:
                    host_keys.add(name, entry.key.get_name(), entry.key)


def _marker(line: str, where: str, known: KnownHosts) -> None:
    fields = line.split()
    if len(fields) < 4 or fields[0] not in ("@revoked", "@cert-authority"):
        return  # an unknown marker: OpenSSH ignores the line too
    try:
        blob = base64.b64decode(fields[3], validate=True)
    except (binascii.Error, ValueError):
        return
    entry = MarkedKey(tuple(fields[1].split(",")), fields[2], blob, where)
    (known.revoked if fields[0] == "@revoked" else known.authorities).append(entry)


def matches(name: str, patterns: Sequence[str]) -> bool:
    """OpenSSH host patterns: ``*``/``?`` wildcards, ``!`` negation, hashed ``|1|`` names."""
    from paramiko.hostkeys import HostKeys

    hit = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern[1:] if negated else pattern
        if bare.startswith("|1|"):
            found = HostKeys.hash_host(name, bare) == bare
        else:
            found = _wildcard(bare).fullmatch(name.lower()) is not None
        if found and negated:
            return False
        hit = hit or found
    return hit


def _wildcard(pattern: str) -> "re.Pattern[str]":
    # OpenSSH patterns know only * and ?: brackets ("[host]:port") are literal, unlike fnmatch's.
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()))


@frozen
class Certificate:
    """An OpenSSH host certificate, field by field (PROTOCOL.certkeys): what ``check_certificate`` checks."""

    key_type: str
    serial: int
    cert_type: int
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical_options: bytes
    signature_key: bytes
    signature: bytes
    signed: bytes  # everything the CA signed


def parse_certificate(blob: bytes) -> Certificate:
    """An OpenSSH certificate blob, field by field (ValueError when it is not one)."""
    reader = _Reader(blob)
    key_type = reader.text()
    if key_type not in _KEY_FIELDS:
        raise ValueError(f"unsupported certificate type {key_type}")
    reader.string()  # nonce
    for _ in range(_KEY_FIELDS[key_type]):
        reader.string()
    serial, cert_type = reader.uint64(), reader.uint32()
    key_id = reader.text()
    principals_reader = _Reader(reader.string())
    principals = []
    while not principals_reader.done():
        principals.append(principals_reader.text())
    valid_after, valid_before = reader.uint64(), reader.uint64()
    critical = reader.string()
    reader.string()  # extensions
    reader.string()  # reserved
    signature_key = reader.string()
    signed = blob[:reader.offset]
    signature = reader.string()
    if not reader.done():
        raise ValueError("trailing bytes after the signature")
    return Certificate(key_type, serial, cert_type, key_id, tuple(principals), valid_after, valid_before,
                       critical, signature_key, signature, signed)


def check_certificate(cert_blob: bytes, hostname: str, lookup_name: str, known: KnownHosts,
                      now: float | None = None) -> str | None:
    """None when the host certificate is good for `hostname`; else why not (one line)."""
    from paramiko import Message, PKey

    try:
        cert = parse_certificate(cert_blob)
    except (ValueError, IndexError) as exc:
        return f"its host certificate cannot be read ({exc})"
    authorities = known.authorities_for(lookup_name)
    if not authorities:
        return f"it presented a host certificate, but no @cert-authority line matches {lookup_name}"
    authority = next((ca for ca in authorities if ca.blob == cert.signature_key), None)
    if authority is None:
        return f"its host certificate (id {cert.key_id!r}) is signed by a CA that no @cert-authority line for {lookup_name} names"
    revoked = known.revoked_entry(cert.signature_key)
    if revoked is not None:
        return f"the CA that signed its certificate is REVOKED ({revoked.where})"
    try:
        ca_key = PKey.from_type_string(authority.key_type, authority.blob)
        good = ca_key.verify_ssh_sig(cert.signed, Message(cert.signature))
    except Exception as exc:  # a CA key paramiko cannot use: refuse, never accept
        return f"the CA key at {authority.where} cannot check the signature ({type(exc).__name__})"
    if not good:
        return f"its host certificate (id {cert.key_id!r}) does not carry a valid signature of the CA at {authority.where}"
    if cert.cert_type != CERT_HOST:
        return f"its certificate (id {cert.key_id!r}) is a user certificate, not a host certificate"
    if hostname not in cert.principals:
        return (f"its host certificate (id {cert.key_id!r}) is for {', '.join(cert.principals) or 'no principal'}, "
                f"not {hostname}")
    moment = int(time.time() if now is None else now)
    if not cert.valid_after <= moment < cert.valid_before:
        return f"its host certificate (id {cert.key_id!r}) is not valid now (expired or not yet valid)"
    if cert.critical_options:
        return f"its host certificate (id {cert.key_id!r}) carries critical options, which host certificates must not"
    return None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.offset = data, 0

    def _take(self, size: int) -> bytes:
        if self.offset + size > len(self.data):
            raise ValueError("truncated certificate")
        chunk = self.data[self.offset:self.offset + size]
        self.offset += size
        return chunk

    def uint32(self) -> int:
        return int.from_bytes(self._take(4), "big")

    def uint64(self) -> int:
        return int.from_bytes(self._take(8), "big")

    def string(self) -> bytes:
        return self._take(self.uint32())

    def text(self) -> str:
        return self.string().decode("utf-8", errors="replace")

    def done(self) -> bool:
        return self.offset == len(self.data)


class HostKeyRefused(Exception):
    """Raised inside the key exchange: a revoked key or a bad certificate (the message says which)."""


def transport_factory(hostname: str, lookup_name: str, known: KnownHosts,
                      ssh_config: Mapping[str, Any] | None = None,
                      on_kex_done: Any = None) -> Any:
    """A paramiko Transport class for one connection that checks @revoked and host certificates.

    Built on paramiko's public hooks only: ``SSHClient.connect(transport_factory=...)`` builds it,
    its ``SecurityOptions`` take the algorithm order (``gpuops.transport.algorithms``, from
    ``ssh_config``), and ``start_client`` returns once the key exchange has verified the server's
    signature, before any authentication: the key it proved is judged there. ``on_kex_done()`` is
    called once the key exchange has finished (for ``--timings``).
    """
    import paramiko

    class RefusedHostKey(paramiko.SSHException, HostKeyRefused):
        pass

    class CheckingTransport(paramiko.Transport):
        certificate_verified = False

        def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(tuned(sock), *args, **kwargs)  # socket tuning, not host keys: transport/tcp_tuning.py
            order_algorithms(self, ssh_config or {})  # an AlgorithmError here: before any byte is sent

        def start_client(self, event: Any = None, timeout: float | None = None) -> None:
            if event is not None:  # paramiko's SSHClient waits for the key exchange; gpuops needs it done here
                raise ValueError("CheckingTransport.start_client judges the host key: call it without an event")
            super().start_client(timeout=timeout)
            if on_kex_done is not None:
                on_kex_done()
            try:
                self.judge_host_key()
            except RefusedHostKey:
                self.close()
                raise

        @property
        def preferred_keys(self):  # type: ignore[override]
            keys = super().preferred_keys
            if not known.authorities_for(lookup_name):
                return keys
            # A CA vouches for this host: ask for its certificate first, as OpenSSH does.
            return tuple([k for k in keys if "-cert-v01@" in k] + [k for k in keys if "-cert-v01@" not in k])

        def judge_host_key(self) -> None:
            """Refuse a revoked key, or a certificate that does not hold where a CA vouches for the host."""
            key = self.get_remote_server_key()
            revoked = known.revoked_entry(key.asbytes())
            if revoked is not None:
                raise RefusedHostKey(f"host key {key.get_name()} {key.fingerprint} of {lookup_name} is REVOKED "
                                     f"({revoked.where}); refusing to connect")
            blob = getattr(key, "public_blob", None)
            # A certificate is judged only where a CA vouches for the host; otherwise the key in
            # it must be a known plain key, as any other.
            if blob is not None and known.authorities_for(lookup_name):
                problem = check_certificate(blob.key_blob, hostname, lookup_name, known)
                if problem is not None:
                    raise RefusedHostKey(f"host {lookup_name} refused: {problem}")
                self.certificate_verified = True

    return CheckingTransport
