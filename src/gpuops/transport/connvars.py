"""Ansible's connection and privilege variables, honoured or refused: never silently ignored.

A fleet set up for Ansible reaches its hosts through what its inventory says: a bastion in
``ansible_ssh_common_args: -o ProxyCommand="ssh -W %h:%p bastion"``, sudo through
``ansible_become``, a python in ``ansible_python_interpreter``. Connecting straight past the bastion
or running as the wrong user because a variable went unread would be worse than failing, so every
``ansible_*`` connection variable is either implemented here or fails its host with one line that
names it. Values are data: nothing here reaches a shell (the ProxyCommand is run by paramiko the
way OpenSSH runs it, through the user's shell, exactly as Ansible's inventory asks).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError, TransportError
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host

# Read by the inventory (address, port, user, key, connection) or below: implemented.
IMPLEMENTED = frozenset({
    "ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user", "ansible_ssh_user",
    "ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_connection",
    "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args",
    "ansible_password", "ansible_ssh_pass", "ansible_ssh_password",
    "ansible_become", "ansible_become_user", "ansible_become_method", "ansible_become_password",
    "ansible_become_pass", "ansible_become_exe", "ansible_become_flags",
    "ansible_python_interpreter", "ansible_ssh_timeout", "ansible_timeout",
    "ansible_host_key_checking", "ansible_ssh_host_key_checking", "ansible_shell_type", "ansible_shell_executable",
})
# Without meaning for gpuops (it copies no files and keeps one connection per host and phase).
IRRELEVANT = frozenset({
    "ansible_ssh_pipelining", "ansible_pipelining", "ansible_group_priority", "ansible_ssh_executable",
    "ansible_sftp_batch_mode", "ansible_scp_if_ssh", "ansible_ssh_transfer_method", "ansible_ssh_retries",
    "ansible_ssh_sftp_extra_args", "ansible_sftp_extra_args", "ansible_scp_extra_args", "ansible_ssh_scp_extra_args",
})
# -o options that only tune OpenSSH's own connection handling (Ansible's defaults set some).
_IGNORED_OPTIONS = frozenset({
    "controlmaster", "controlpersist", "controlpath", "compression", "loglevel", "tcpkeepalive",
    "serveraliveinterval", "serveralivecountmax", "connectionattempts", "identitiesonly",
    "preferredauthentications", "pubkeyauthentication", "passwordauthentication",
    "kbdinteractiveauthentication", "gssapiauthentication", "batchmode", "hashknownhosts",
    "addressfamily", "requesttty", "forwardx11", "forwardagent", "visualhostkey", "checkhostip",
})
_IGNORED_FLAGS = frozenset({"-C", "-q", "-T", "-t", "-tt", "-4", "-6", "-x", "-a", "-n"})
_TRUE = {"true", "yes", "on", "1", "y"}
_FALSE = {"false", "no", "off", "0", "n", ""}


@frozen
class SSHSettings:
    """How to reach one host beyond address/port/user/key: what its connection variables ask."""

    proxy_command: str | None = None
    proxy_jump: str | None = None
    hostname: str | None = None             # -o HostName
    port: int | None = None                 # -o Port / -p (ansible_port wins)
    user: str | None = None                 # -o User / -l (ansible_user wins)
    identity_files: tuple[str, ...] = ()    # -i / -o IdentityFile
    known_hosts_files: tuple[str, ...] = ()  # -o UserKnownHostsFile (in addition to the usual files)
    accept_new_host_key: bool = False       # -o StrictHostKeyChecking=accept-new
    connect_timeout: float | None = None    # ansible_ssh_timeout / -o ConnectTimeout
    keepalive: int | None = None            # -o ServerAliveInterval
    password: str | None = field(default=None, repr=False)  # ansible_password (a secret)


@frozen
class Become:
    """What a host's ``ansible_become*`` variables ask: whether its commands run through sudo, as which user
    (None: root), and the sudo password (a secret)."""

    enabled: bool = False
    user: str | None = None
    password: str | None = field(default=None, repr=False)


def refuse_connection_vars(extra_vars: Mapping[str, Any]) -> None:
    """``-e ansible_become=true`` (or ``ansible_user``, ``ansible_port``, ...) would be silently ignored:
    how a host is reached is settled from the inventory and the command's flags before any variable
    of the run is read. Refused before any connection, naming the flag or place that works.
    ``ansible_python_interpreter`` is not refused: the host's preamble reads it from ``-e`` too."""
    flags = {"ansible_user": "-u USER", "ansible_ssh_user": "-u USER", "ansible_become": "-b/--become",
             "ansible_become_password": "-K or $GPUOPS_BECOME_PASS", "ansible_become_pass": "-K or $GPUOPS_BECOME_PASS",
             "ansible_ssh_private_key_file": "--private-key FILE", "ansible_private_key_file": "--private-key FILE"}
    for name in extra_vars:
        if name in IMPLEMENTED and name != "ansible_python_interpreter":
            instead = f"use {flags[name]}, or set it" if name in flags else "set it"
            raise GpuopsError(f"-e {name}: connection variables are not read from -e (the connection is made "
                              f"before the run's variables); {instead} in the inventory (host_vars/group_vars)")


def check_variables(host: Host) -> None:
    """Fail the host on an ``ansible_*`` connection variable gpuops does not implement."""
    for name in host.vars or {}:
        if name.startswith("ansible_") and name not in IMPLEMENTED and name not in IRRELEVANT:
            raise TransportError(host.name, f"{name} is an Ansible connection variable gpuops does not implement; "
                                            "remove it or reach the host another way")
    variables = host.vars or {}
    for name in ("ansible_host_key_checking", "ansible_ssh_host_key_checking"):
        if name in variables and not truthy(variables[name], name, host.name):
            raise TransportError(host.name, f"{name}: false is refused: gpuops always verifies host keys "
                                            "(record new ones with --accept-new-host-keys)")
    transport_name(host)
    shell = variables.get("ansible_shell_type")
    if shell not in (None, "sh"):
        raise TransportError(host.name, f"ansible_shell_type {shell!r} is not supported (gpuops runs POSIX sh)")
    executable = variables.get("ansible_shell_executable")
    if executable not in (None, "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash"):
        raise TransportError(host.name, f"ansible_shell_executable {executable!r} is not supported (gpuops runs /bin/sh)")


TRANSPORTS = ("paramiko", "openssh")


def transport_name(host: Host) -> str:
    """``gpuops_connection``: paramiko (the default) or openssh (the system's ssh client)."""
    value = str((host.vars or {}).get("gpuops_connection") or "paramiko")
    if value not in TRANSPORTS:
        raise TransportError(host.name, f"gpuops_connection {value!r} is not one of {', '.join(TRANSPORTS)}")
    return value


def truthy(value: Any, name: str, host: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TransportError(host, f"{name} must be true or false, got {value!r}")


def ssh_settings(host: Host, openssh: bool = False) -> SSHSettings:
    """What the host's ssh arguments and connection variables ask for (refusing what gpuops cannot do).

    With ``openssh`` the arguments go to OpenSSH itself, which honours every option: only what
    would weaken host-key checking is refused then.
    """
    check_variables(host)
    variables = host.vars or {}
    found: dict[str, Any] = {"identity_files": [], "known_hosts_files": []}
    for name in ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args"):
        value = variables.get(name)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise TransportError(host.name, f"{name} must be a string of ssh arguments, got {type(value).__name__}")
        _read_ssh_args(value, name, host.name, found, openssh)
    timeout = _first(variables, "ansible_ssh_timeout", "ansible_timeout")
    if timeout is not None:
        found["connect_timeout"] = _seconds(timeout, "ansible_ssh_timeout", host.name)
    password = _first(variables, "ansible_password", "ansible_ssh_pass", "ansible_ssh_password")
    return SSHSettings(
        proxy_command=found.get("proxy_command"), proxy_jump=found.get("proxy_jump"), hostname=found.get("hostname"),
        port=found.get("port"), user=found.get("user"), identity_files=tuple(found["identity_files"]),
        known_hosts_files=tuple(found["known_hosts_files"]), accept_new_host_key=bool(found.get("accept_new")),
        connect_timeout=found.get("connect_timeout"), keepalive=found.get("keepalive"),
        password=None if password is None else str(password),
    )


def become_settings(variables: Mapping[str, Any], host: str) -> Become:
    """``ansible_become*``: sudo only (other methods are refused), with its user and password."""
    enabled = truthy(variables.get("ansible_become", False), "ansible_become", host)
    method = variables.get("ansible_become_method")
    if method not in (None, "sudo", "ansible.builtin.sudo"):
        raise TransportError(host, f"ansible_become_method {method!r} is not supported (gpuops becomes with sudo)")
    exe = variables.get("ansible_become_exe")
    if exe not in (None, "sudo"):
        raise TransportError(host, f"ansible_become_exe {exe!r} is not supported (gpuops runs sudo from PATH)")
    flags = variables.get("ansible_become_flags")
    if flags not in (None, "", "-H -S -n", "-H -S"):
        raise TransportError(host, f"ansible_become_flags {flags!r} is not supported (gpuops chooses sudo's flags)")
    user = variables.get("ansible_become_user")
    password = _first(variables, "ansible_become_password", "ansible_become_pass")
    return Become(enabled=enabled, user=None if user in (None, "", "root") else str(user),
                  password=None if password in (None, "") else str(password))


def python_interpreter(variables: Mapping[str, Any]) -> str | None:
    """``ansible_python_interpreter``, unless it asks for discovery (gpuops discovers by itself)."""
    value = variables.get("ansible_python_interpreter")
    if value is None or str(value).startswith("auto"):
        return None
    return str(value)


def _first(variables: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if variables.get(name) is not None:
            return variables[name]
    return None


def _seconds(value: Any, name: str, host: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or seconds <= 0:
        raise TransportError(host, f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


def _read_ssh_args(text: str, variable: str, host: str, found: dict[str, Any], openssh: bool = False) -> None:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise TransportError(host, f"{variable}: cannot split {text!r}: {exc}") from None
    index = 0
    while index < len(words):
        word = words[index]
        if word in ("-o", "-J", "-i", "-p", "-l"):
            if index + 1 >= len(words):
                raise TransportError(host, f"{variable}: {word} needs a value")
            flag, value, index = word, words[index + 1], index + 2
        elif len(word) > 2 and word[:2] in ("-o", "-J", "-i", "-p", "-l"):
            flag, value, index = word[:2], word[2:], index + 1
        elif word in _IGNORED_FLAGS or openssh:
            index += 1
            continue
        else:
            raise TransportError(host, f"{variable}: ssh argument {word!r} is not supported by gpuops' ssh "
                                       "(supported: -o Option=value, -J, -i, -p, -l)")
        if flag == "-o":
            _option(value, variable, host, found, openssh)
        elif flag == "-J":
            found["proxy_jump"] = value
        elif flag == "-i":
            found["identity_files"].append(value)
        elif flag == "-p":
            found["port"] = _port(value, variable, host)
        else:
            found["user"] = value


def _option(text: str, variable: str, host: str, found: dict[str, Any], openssh: bool = False) -> None:
    key, sep, value = text.partition("=")
    if not sep:
        key, _, value = text.strip().partition(" ")
    key, value = key.strip(), value.strip()
    lowered = key.lower()
    if not key or not value:
        raise TransportError(host, f"{variable}: -o {text!r} is not Option=value")
    if lowered == "proxycommand":
        found["proxy_command"] = None if value.lower() == "none" else value
    elif lowered == "proxyjump":
        found["proxy_jump"] = None if value.lower() == "none" else value
    elif lowered == "hostname":
        found["hostname"] = value
    elif lowered == "port":
        found["port"] = _port(value, variable, host)
    elif lowered == "user":
        found["user"] = value
    elif lowered == "identityfile":
        found["identity_files"].append(value)
    elif lowered in ("userknownhostsfile", "globalknownhostsfile"):
        found["known_hosts_files"].extend(value.split())
    elif lowered == "stricthostkeychecking":
        if value.lower() in ("no", "off", "false"):
            raise TransportError(host, f"{variable}: StrictHostKeyChecking={value} is refused: gpuops always verifies "
                                       "host keys (record new ones with --accept-new-host-keys)")
        found["accept_new"] = value.lower() == "accept-new"
    elif lowered == "connecttimeout":
        found["connect_timeout"] = _seconds(value, f"{variable} ConnectTimeout", host)
    elif lowered == "serveraliveinterval":
        found["keepalive"] = int(_seconds(value, f"{variable} ServerAliveInterval", host))
    elif lowered not in _IGNORED_OPTIONS and not openssh:
        raise TransportError(host, f"{variable}: ssh option {key} is not supported by gpuops' ssh "
                                   "(it would be ignored, so the host is not contacted)")


def _port(value: str, variable: str, host: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise TransportError(host, f"{variable}: port {value!r} is not a port number")
    return int(value)
