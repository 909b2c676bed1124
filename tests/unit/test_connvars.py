"""Ansible connection variables: what gpuops' ssh makes of them, and what it refuses (one line each)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from gpuops.errors import TransportError
from gpuops.inventory import Host
from gpuops.transport.connvars import become_settings, check_variables, ssh_settings


def host(**variables: Any) -> Host:
    return Host(name="gpu01", address=None, port=None, user=None, key_file=None, connection="ssh",
                groups=("all",), vars=MappingProxyType(variables))


def test_common_and_extra_args_are_read_like_ssh_reads_them() -> None:
    settings = ssh_settings(host(
        ansible_ssh_common_args='-o ProxyCommand="ssh -W %h:%p -q bastion" -o ControlMaster=auto -o ControlPersist=60s',
        ansible_ssh_extra_args="-oUserKnownHostsFile=/etc/fleet/known_hosts -o StrictHostKeyChecking=accept-new "
                               "-o ServerAliveInterval=15 -i ~/.ssh/fleet -C",
        ansible_ssh_timeout=7, ansible_password="pw-value"))
    assert settings.proxy_command == "ssh -W %h:%p -q bastion"
    assert settings.known_hosts_files == ("/etc/fleet/known_hosts",)
    assert settings.accept_new_host_key and settings.keepalive == 15 and settings.connect_timeout == 7.0
    assert settings.identity_files == ("~/.ssh/fleet",) and settings.password == "pw-value"
    assert "pw-value" not in repr(settings)
    jump = ssh_settings(host(ansible_ssh_common_args="-J ops@bastion:2222 -p 2200 -l admin"))
    assert (jump.proxy_jump, jump.port, jump.user) == ("ops@bastion:2222", 2200, "admin")
    assert ssh_settings(host(ansible_ssh_common_args="-o ProxyCommand=none")).proxy_command is None


@pytest.mark.parametrize(("variables", "message"), [
    ({"ansible_docker_extra_args": "x"}, "ansible_docker_extra_args is an Ansible connection variable gpuops does not implement"),
    ({"ansible_ssh_common_args": "-o StrictHostKeyChecking=no"}, "StrictHostKeyChecking=no is refused"),
    ({"ansible_ssh_common_args": "-o LocalForward=1:h:2"}, "ssh option LocalForward is not supported"),
    ({"ansible_ssh_common_args": "-F /etc/ssh/other"}, "ssh argument '-F' is not supported"),
    ({"ansible_ssh_common_args": "-o 'ProxyCommand"}, "cannot split"),
    ({"ansible_ssh_common_args": "-p 99999"}, "port '99999' is not a port number"),
    ({"ansible_ssh_timeout": "soon"}, "ansible_ssh_timeout must be a positive number of seconds"),
    ({"ansible_ssh_host_key_checking": "no"}, "ansible_ssh_host_key_checking: false is refused"),
    ({"ansible_shell_type": "csh"}, "ansible_shell_type 'csh' is not supported"),
])
def test_what_cannot_be_honoured_is_refused(variables: dict[str, Any], message: str) -> None:
    with pytest.raises(TransportError) as caught:
        ssh_settings(host(**variables))
    assert message in str(caught.value) and str(caught.value).startswith("gpu01: ")


def test_irrelevant_variables_pass() -> None:
    check_variables(host(ansible_ssh_pipelining=True, ansible_group_priority=2, ansible_python_interpreter="/usr/bin/python3"))


def test_become() -> None:
    on = become_settings({"ansible_become": "yes", "ansible_become_user": "sglang", "ansible_become_pass": "pw"}, "h")
    assert on.enabled and on.user == "sglang" and on.password == "pw"
    assert become_settings({"ansible_become_user": "root"}, "h").user is None
    assert not become_settings({}, "h").enabled
    for variables, message in [({"ansible_become_method": "doas"}, "ansible_become_method 'doas' is not supported"),
                               ({"ansible_become": "maybe"}, "ansible_become must be true or false"),
                               ({"ansible_become_flags": "-i"}, "ansible_become_flags '-i' is not supported")]:
        with pytest.raises(TransportError, match=message):
            become_settings(variables, "h")


def test_become_user_is_quoted_into_sudo_and_the_password_stays_on_stdin() -> None:
    import shlex

    from gpuops.transport.become import become_wrap

    command, stdin = become_wrap("id -un", "pw; rm -rf /", user="svc; touch /tmp/x")
    assert command.startswith("sudo -S -p '' -u 'svc; touch /tmp/x' -- /bin/sh -c ")
    assert "pw; rm" not in command and stdin.startswith(b"pw; rm -rf /\n")
    assert shlex.split(command)[5] == "svc; touch /tmp/x"


def test_the_openssh_connection_takes_any_ssh_option_but_never_a_weaker_host_key_check() -> None:
    ssh_settings(host(ansible_ssh_common_args="-o LocalForward=1:h:2 -A -o GSSAPIDelegateCredentials=yes"), openssh=True)
    with pytest.raises(TransportError, match="StrictHostKeyChecking=no is refused"):
        ssh_settings(host(ansible_ssh_common_args="-o StrictHostKeyChecking=no"), openssh=True)
