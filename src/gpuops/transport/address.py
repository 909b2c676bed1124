"""The address gpuops reaches a host at, without connecting: what the SSH transports resolve.

In the order they take it: the inventory's ``ansible_host``, a ``-o HostName=`` in the host's ssh
arguments, the ``HostName`` that ~/.ssh/config (then /etc/ssh/ssh_config) gives the inventory
name (an ssh-config alias), else the inventory name itself. A local host is its ``ansible_host``
or its name. Other machines that must reach the host's server (a router in front of replicas,
``apply/replicas.py``) reach it at this address.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpuops.transport.connvars import ssh_settings

if TYPE_CHECKING:
    from gpuops.inventory import Host

SSH_CONFIG_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")


def connect_address(host: "Host") -> str:
    """Where the transport connects for ``host`` (see the module's order)."""
    if host.address:
        return host.address
    if host.is_local:
        return host.name
    configured = ssh_settings(host).hostname
    if configured:
        return configured
    return ssh_config_hostname(host.name) or host.name


def ssh_config_hostname(alias: str, files: tuple[str, ...] = SSH_CONFIG_FILES) -> str | None:
    """The ``HostName`` the first ssh config file that names one gives ``alias`` (``%h`` expanded
    by paramiko as ssh does); None when none does. An unreadable file is skipped: the connection
    itself reports it."""
    import paramiko  # heavy: only for a host that names no address

    for name in files:
        path = os.path.expanduser(name)
        if not os.path.isfile(path):
            continue
        try:
            found = paramiko.SSHConfig.from_path(path).lookup(alias).get("hostname")
        except (OSError, UnicodeDecodeError, paramiko.ssh_exception.ConfigParseError):
            continue
        if found and found != alias:
            return str(found)
    return None
