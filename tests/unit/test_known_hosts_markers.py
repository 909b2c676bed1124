"""known_hosts host patterns as OpenSSH matches them (brackets literal, ! negates, hashed names)."""

from __future__ import annotations

from paramiko.hostkeys import HostKeys

from gpuops.transport.known_hosts import matches, parse_certificate


def test_patterns() -> None:
    assert matches("[127.0.0.1]:2222", ["[127.0.0.1]:*"])
    assert not matches("1", ["[127.0.0.1]:*"])            # not a character class
    assert matches("gpu01.fleet.example", ["*.fleet.example"])
    assert not matches("gpu01.fleet.example", ["*.fleet.example", "!gpu01.*"])
    assert matches("gpu0a", ["gpu0?"]) and not matches("gpu0ab", ["gpu0?"])
    assert matches("GPU01", ["gpu01"])
    hashed = HostKeys.hash_host("gpu01")
    assert matches("gpu01", [hashed]) and not matches("gpu02", [hashed])


def test_a_damaged_certificate_is_a_value_error() -> None:
    import pytest

    with pytest.raises(ValueError):
        parse_certificate(b"\x00\x00\x00\x0bssh-ed25519")
    with pytest.raises(ValueError):
        parse_certificate(b"\x00\x00\x00\x20ssh-ed25519-cert-v01@openssh.com\x00\x00\x00")
