"""OpenSSH's own refusal is a failed host, never an answer: ssh exits 255 for its own errors."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("address", ["bad`name", "-oProxyCommand=x"])
def test_a_host_name_ssh_rejects_fails_the_host(run_gpuops, tmp_path: Path, address: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    h01:\n      ansible_host: '%s'\n      gpuops_connection: openssh\n"
                         % address)
    done = run_gpuops("inspect", "host", "-i", str(inventory), timeout=60)
    both = done.stdout + done.stderr
    assert done.returncode == 1, both
    assert "0 of 1 hosts answered" in both and "h01" in both, both


def test_ssh_exiting_255_for_itself_is_a_transport_error(tmp_path: Path) -> None:
    from gpuops.errors import TransportError
    from gpuops.inventory import Host
    from gpuops.transport import ConnectOptions
    from gpuops.transport.openssh import OpenSSHConnection

    host = Host(name="h01", address="bad`name", port=None, user=None, key_file=None, connection="ssh", groups=(),
                vars={"gpuops_connection": "openssh"})
    conn = OpenSSHConnection(host, ConnectOptions())
    with pytest.raises(TransportError, match="h01: ssh to .* failed"):
        conn.run("true", timeout=30)
