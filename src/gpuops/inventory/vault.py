"""Ansible Vault, read without Ansible: ``!vault |`` values and vault-encrypted vars files.

The format (Ansible's ``VaultAES256``, envelope 1.1, or 1.2 with a vault id)::

    $ANSIBLE_VAULT;1.1;AES256            (or $ANSIBLE_VAULT;1.2;AES256;prod)
    <hex of: hex(salt) "\\n" hex(hmac) "\\n" hex(ciphertext)>, wrapped at 80 columns

Keys: PBKDF2-HMAC-SHA256(password, salt, 10000 rounds) -> 80 bytes = AES key (32) | HMAC key (32)
| CTR counter block (16). The HMAC-SHA256 of the ciphertext is checked (in constant time) before
anything is decrypted; the plaintext carries PKCS#7 padding. The primitives come from
``cryptography`` (already installed with paramiko), so gpuops never needs Ansible for this.

Decrypted text comes back as ``VaultText``, a ``str`` that says it is a secret, so that whatever
prints or journals values can mask it.
"""

from __future__ import annotations

import binascii
import hmac
import os
import subprocess
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from gpuops.errors import InventoryError
from gpuops.remote.secret_mask import SecretText
from gpuops.frozen import frozen

HEADER = "$ANSIBLE_VAULT"
DEFAULT_ID = "default"
PASSWORD_FILE_ENV = "ANSIBLE_VAULT_PASSWORD_FILE"
_PASSWORD_SCRIPT_TIMEOUT = 60.0


class VaultText(SecretText):
    """A value that came out of a vault: a secret (never printed, journaled or stored; the secrets
    policy masks a ``SecretText`` whatever its name)."""

    __slots__ = ()

    def __repr__(self) -> str:  # a stray repr() in an error message must not leak it
        return "VaultText('********')"


@frozen
class EncryptedValue:
    """A ``!vault`` value not decrypted (no password given): an error only if a selected host uses it."""

    envelope: str
    where: str  # path:line of the value, for the error message

    def __repr__(self) -> str:
        return f"EncryptedValue({self.where})"


@frozen
class VaultSecret:
    """One vault password given on the command line, with the vault id it is for (``default`` when none is
    named); its repr never shows the password."""

    vault_id: str
    password: bytes = b""

    def __repr__(self) -> str:
        return f"VaultSecret({self.vault_id!r})"


@frozen
class Vault:
    """The passwords given on the command line, tried in order (a matching vault id first)."""

    secrets: tuple[VaultSecret, ...] = ()
    # envelope -> plaintext: one value shared by many hosts is derived (PBKDF2) once per command
    _plain: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    def decrypt(self, envelope: str, where: str) -> bytes:
        """The plaintext of a vault envelope; `where` names the file (and variable) in errors."""
        if envelope in self._plain:
            return self._plain[envelope]
        version, vault_id, body = _parse(envelope, where)
        if not self.secrets:
            raise InventoryError(f"{where} is vault-encrypted{_id_note(vault_id)}: {NO_PASSWORD_HINT}")
        ordered = [s for s in self.secrets if vault_id and s.vault_id == vault_id]
        ordered += [s for s in self.secrets if s not in ordered]
        for secret in ordered:
            plaintext = _decrypt_aes256(body, secret.password, where)
            if plaintext is not None:
                self._plain[envelope] = plaintext
                return plaintext
        raise InventoryError(
            f"{where}: no vault password given decrypts it{_id_note(vault_id)} (vault format {version})"
        )


NO_PASSWORD_HINT = ("give its password with --vault-password-file FILE, --vault-id [ID@]FILE, "
                    f"--ask-vault-pass or ${PASSWORD_FILE_ENV}")


def _id_note(vault_id: str | None) -> str:
    return f" (vault id {vault_id!r})" if vault_id else ""


def is_encrypted(text: str) -> bool:
    return text.lstrip().startswith(HEADER + ";")


def _parse(envelope: str, where: str) -> tuple[str, str | None, bytes]:
    lines = envelope.strip().splitlines()
    header = lines[0].strip().split(";") if lines else []
    if len(header) < 3 or header[0] != HEADER:
        raise InventoryError(f"{where}: not an Ansible vault value (it must start with {HEADER};1.1;AES256)")
    version, cipher = header[1].strip(), header[2].strip()
    if version not in ("1.1", "1.2"):
        raise InventoryError(f"{where}: vault format {version} is not supported (1.1 and 1.2 are)")
    if cipher != "AES256":
        raise InventoryError(f"{where}: vault cipher {cipher} is not supported (AES256 is)")
    vault_id = header[3].strip() if version == "1.2" and len(header) > 3 else None
    try:
        body = binascii.unhexlify("".join(line.strip() for line in lines[1:]))
    except (binascii.Error, ValueError):
        raise InventoryError(f"{where}: the vault value is damaged (not hexadecimal)") from None
    return version, vault_id, body


def _decrypt_aes256(body: bytes, password: bytes, where: str) -> bytes | None:
    """The plaintext, or None when this password's HMAC does not match (a wrong password)."""
    from cryptography.hazmat.primitives import hashes, padding
    from cryptography.hazmat.primitives import hmac as crypto_hmac
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

    try:
        salt_hex, mac_hex, data_hex = body.split(b"\n", 2)
        salt, expected_mac, ciphertext = (binascii.unhexlify(p.strip()) for p in (salt_hex, mac_hex, data_hex))
    except (ValueError, binascii.Error):
        raise InventoryError(f"{where}: the vault value is damaged (bad salt/hmac/ciphertext)") from None
    keys = PBKDF2HMAC(algorithm=hashes.SHA256(), length=80, salt=salt, iterations=10000).derive(password)
    cipher_key, mac_key, counter = keys[:32], keys[32:64], keys[64:80]
    signer = crypto_hmac.HMAC(mac_key, hashes.SHA256())
    signer.update(ciphertext)
    if not hmac.compare_digest(signer.finalize(), expected_mac):
        return None
    decryptor = Cipher(algorithms.AES(cipher_key), modes.CTR(counter)).decryptor()
    padded = decryptor.update(ciphertext) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(padded) + unpadder.finalize()
    except ValueError:
        raise InventoryError(f"{where}: the vault value is damaged (bad padding)") from None


def as_secret(value: Any) -> Any:
    """Every string in a value decrypted from a vault file, marked as a secret."""
    if isinstance(value, str):
        return VaultText(value)
    if isinstance(value, dict):
        return {key: as_secret(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_secret(item) for item in value]
    return value


def decrypt_values(value: Any, vault: Vault | None) -> Any:
    """``EncryptedValue``s replaced by their ``VaultText`` where a password was given; else left."""
    if isinstance(value, EncryptedValue):
        if vault is None or not vault.secrets:
            return value
        return VaultText(vault.decrypt(value.envelope, value.where).decode("utf-8", errors="replace"))
    if isinstance(value, dict):
        return {key: decrypt_values(item, vault) for key, item in value.items()}
    if isinstance(value, list):
        return [decrypt_values(item, vault) for item in value]
    return value


def find_encrypted(value: Any, name: str) -> tuple[str, EncryptedValue] | None:
    """The first value still encrypted inside `value` (named by its top-level variable)."""
    if isinstance(value, EncryptedValue):
        return name, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for _, item in items:
        found = find_encrypted(item, name)
        if found:
            return found
    return None


# ----------------------------------------------------------------------- passwords


def read_password_source(source: str, vault_id: str) -> bytes:
    """A password from a file, or from the stdout of an executable file (as Ansible does)."""
    path = os.path.expanduser(source)
    if not os.path.isfile(path):
        raise InventoryError(f"vault password file {source} does not exist")
    if os.access(path, os.X_OK):
        try:
            done = subprocess.run([os.path.abspath(path), "--vault-id", vault_id], capture_output=True,
                                  timeout=_PASSWORD_SCRIPT_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InventoryError(f"vault password script {source} failed: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise InventoryError(f"vault password script {source} failed: {tail}")
        password = done.stdout.strip()
    else:
        try:
            with open(path, "rb") as handle:
                password = handle.read().strip()
        except OSError as exc:
            raise InventoryError(f"cannot read vault password file {source}: {exc.strerror}") from None
    if not password:
        raise InventoryError(f"vault password file {source} is empty")
    return password


def vault_from_options(password_files: Sequence[str] = (), vault_ids: Sequence[str] = (),
                       ask: bool = False, prompt: Any = None) -> Vault:
    """The Vault for --vault-password-file, --vault-id [ID@]SOURCE, --ask-vault-pass, $ANSIBLE_VAULT_PASSWORD_FILE.

    `prompt(text) -> str` asks for a password (only called for --ask-vault-pass / ``ID@prompt``).
    """
    secrets: list[VaultSecret] = []
    for spec in vault_ids:
        label, sep, source = spec.partition("@")
        if not sep:
            label, source = DEFAULT_ID, spec
        if not label or not source:
            raise InventoryError(f"--vault-id {spec!r}: expected [ID@]FILE or [ID@]prompt")
        if source == "prompt":
            secrets.append(VaultSecret(label, _ask(prompt, f"Vault password ({label}): ")))
        else:
            secrets.append(VaultSecret(label, read_password_source(source, label)))
    for source in password_files:
        secrets.append(VaultSecret(DEFAULT_ID, read_password_source(source, DEFAULT_ID)))
    if not password_files and not vault_ids and os.environ.get(PASSWORD_FILE_ENV):
        secrets.append(VaultSecret(DEFAULT_ID, read_password_source(os.environ[PASSWORD_FILE_ENV], DEFAULT_ID)))
    if ask:
        secrets.append(VaultSecret(DEFAULT_ID, _ask(prompt, "Vault password: ")))
    return Vault(tuple(secrets))


def _ask(prompt: Any, text: str) -> bytes:
    if prompt is None:
        raise InventoryError("a vault password must be typed, but there is no terminal to ask on")
    answer = prompt(text)
    if not answer:
        raise InventoryError("an empty vault password was given")
    return answer.encode("utf-8")
