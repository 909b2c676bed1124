"""The SSH transport against real OpenSSH sshd on loopback (lab hosts).

Host keys are verified, never silently accepted; one host's failure stays that host's; programs
and their outputs of any size travel through one channel without deadlock.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest

from gpuops.inventory import Host, load_inventory
from gpuops.transport import ConnectOptions, connect, run_on_hosts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    from gpuops.lab.hosts import LabSpec, start_lab

    with start_lab(tmp_path_factory.mktemp("lab"), [LabSpec(gpu="h200-x1", sglang=None, server=False, count=2)]) as lab:
        yield lab


@pytest.fixture(autouse=True)
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of our own: the user's real ~/.ssh is never read or written by these tests."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def _hosts(lab) -> list[Host]:
    return load_inventory(str(lab.inventory_path)).select(None)


def _without_lab_known_hosts(host: Host) -> Host:
    vars_ = {k: v for k, v in host.vars.items() if k != "gpuops_known_hosts"}
    return dataclasses.replace(host, vars=vars_)


def test_big_program_in_big_output_out_in_one_exec(lab) -> None:
    host = _hosts(lab)[0]
    conn = connect(host, ConnectOptions())
    try:
        program = b"#" * 1_000_000 + b"\nhead -c 3000000 /dev/zero | tr '\\0' x; echo; echo err >&2; exit 4\n"
        result = conn.run("sh -s", stdin=program, timeout=60)
    finally:
        conn.close()
    assert result.exit_status == 4
    assert result.stdout == b"x" * 3_000_000 + b"\n"
    assert result.stderr == b"err\n"


def test_unknown_host_key_is_refused_and_names_the_host(lab) -> None:
    host = _without_lab_known_hosts(_hosts(lab)[0])
    outcome = run_on_hosts([host], lambda h: connect(h, ConnectOptions()).run("true"))[host.name]
    assert not outcome.ok
    assert "host key" in outcome.error and "unknown" in outcome.error
    assert host.name in str(outcome) or "127.0.0.1" in outcome.error


def test_accept_new_records_the_key_then_verifies_it(lab, empty_home: Path) -> None:
    host = _without_lab_known_hosts(_hosts(lab)[0])
    conn = connect(host, ConnectOptions(accept_new_host_keys=True))
    assert conn.run("echo hi").stdout == b"hi\n"
    conn.close()
    recorded = (empty_home / ".ssh" / "known_hosts").read_text()
    assert f"[127.0.0.1]:{host.port} ssh-ed25519 " in recorded
    # Now known: a plain connection (no accept-new) works.
    conn = connect(host, ConnectOptions())
    assert conn.run("echo again").stdout == b"again\n"
    conn.close()


def test_changed_host_key_is_refused_even_with_accept_new(lab, empty_home: Path, tmp_path: Path) -> None:
    host = _without_lab_known_hosts(_hosts(lab)[0])
    other = _hosts(lab)[1]
    # Claim that host 1's address:port has host 2's key (what a man in the middle would look like).
    other_key = next(line for line in Path(lab.known_hosts).read_text().splitlines() if f"]:{other.port} " in line)
    forged = f"[127.0.0.1]:{host.port} " + other_key.split(" ", 1)[1] + "\n"
    known = empty_home / ".ssh" / "known_hosts"
    known.write_text(forged)
    for accept_new in (False, True):
        outcome = run_on_hosts([host], lambda h: connect(h, ConnectOptions(accept_new_host_keys=accept_new)).run("true"))[host.name]  # noqa: B023 (runs now)
        assert not outcome.ok
        assert "host key" in outcome.error and "CHANGED" in outcome.error
    assert known.read_text() == forged  # never replaced


def test_refused_and_slow_hosts_fail_alone(lab) -> None:
    good = _hosts(lab)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    refused = dataclasses.replace(good[0], name="refused", port=dead_port)

    def work(h: Host) -> bytes:
        conn = connect(h, ConnectOptions(command_timeout=3))
        try:
            if h.name == good[1].name:
                return conn.run("sleep 30").stdout  # the slow host
            return conn.run("hostname >/dev/null; echo ok").stdout
        finally:
            conn.close()

    outcomes = run_on_hosts([good[0], refused, good[1]], work, forks=4)
    assert outcomes[good[0].name].ok and outcomes[good[0].name].value == b"ok\n"
    assert not outcomes["refused"].ok and "connection refused" in outcomes["refused"].error
    assert not outcomes[good[1].name].ok and "timed out" in outcomes[good[1].name].error


def test_wrong_key_file_is_an_auth_failure(lab, tmp_path: Path) -> None:
    import subprocess

    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = dataclasses.replace(_hosts(lab)[0], key_file=str(key))
    outcome = run_on_hosts([host], lambda h: connect(h, ConnectOptions()).run("true"))[host.name]
    assert not outcome.ok and "authentication failed" in outcome.error


def test_ssh_agent_authenticates_without_a_key_file(lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            import time

            time.sleep(0.05)
        env = dict(SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(lab.client_key)], check=True, env={**__import__("os").environ, **env})
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        host = dataclasses.replace(_hosts(lab)[0], key_file=None)
        conn = connect(host, ConnectOptions())
        assert conn.run("echo via-agent").stdout == b"via-agent\n"
        conn.close()
    finally:
        agent.terminate()
        agent.wait(5)


def test_host_without_address_is_reached_through_ssh_config_and_proxyjump(lab, empty_home: Path) -> None:
    """HostName, Port, User, IdentityFile and ProxyJump come from ~/.ssh/config, as with plain ssh."""
    first, second = _hosts(lab)
    (empty_home / ".ssh" / "config").write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {first.port}\n  User {first.user}\n  IdentityFile {first.key_file}\n"
        f"Host gpu-behind-jump\n  HostName 127.0.0.1\n  Port {second.port}\n  User {second.user}\n"
        f"  IdentityFile {second.key_file}\n  ProxyJump jumpbox\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n"
    )
    (empty_home / ".ssh" / "known_hosts").write_text(Path(lab.known_hosts).read_text())
    host = Host(name="gpu-behind-jump", address=None, port=None, user=None, key_file=None, connection="ssh",
                groups=(), vars={})
    jump_log = lab.host(first.name).dir / "sshd.log"
    logins_before = jump_log.read_text().count("Accepted publickey")
    conn = connect(host, ConnectOptions())
    try:
        assert conn.run("echo $GPUOPS_LAB_HOST").stdout == f"{second.name}\n".encode()
    finally:
        conn.close()
    # The jump host saw a login of its own: the connection really went through it.
    assert jump_log.read_text().count("Accepted publickey") == logins_before + 1


def _behind_bastion(lab, empty_home: Path, **extra_vars) -> tuple[Host, Path]:
    """A host whose name resolves nowhere, reachable only through the first lab host's sshd."""
    bastion, target = _hosts(lab)
    name = "gpu-behind-bastion.invalid"
    known = empty_home / ".ssh" / "known_hosts"
    target_key = Path(lab.known_hosts).read_text().splitlines()
    line = next(l for l in target_key if l.startswith(f"[127.0.0.1]:{target.port} "))
    known.write_text(Path(lab.known_hosts).read_text() + line.replace(f"[127.0.0.1]:{target.port}", f"[{name}]:{target.port}") + "\n")
    proxy = (f"ssh -q -i {bastion.key_file} -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes "
             f"-o BatchMode=yes -p {bastion.port} -W 127.0.0.1:%p {bastion.user}@127.0.0.1")
    variables = {**dict(target.vars), "ansible_host": name,
                 "ansible_ssh_common_args": f'-o ProxyCommand="{proxy}" -o ControlMaster=auto -o ControlPersist=60s',
                 **extra_vars}
    host = dataclasses.replace(target, address=name, vars=variables)
    return host, lab.host(bastion.name).dir / "sshd.log"


def test_proxycommand_in_ansible_ssh_common_args_goes_through_the_bastion(lab, empty_home: Path) -> None:
    host, bastion_log = _behind_bastion(lab, empty_home)
    hops_before = bastion_log.read_text().count("Accepted publickey")
    conn = connect(host, ConnectOptions())
    try:
        assert conn.run("echo $GPUOPS_LAB_HOST").stdout == f"{_hosts(lab)[1].name}\n".encode()
    finally:
        conn.close()
    # The bastion's sshd logged the hop: the connection went through it (the name resolves nowhere).
    assert bastion_log.read_text().count("Accepted publickey") == hops_before + 1


def test_connection_variables_gpuops_cannot_honour_fail_the_host_before_contact(lab, empty_home: Path) -> None:
    host, bastion_log = _behind_bastion(lab, empty_home)
    cases = {
        "ansible_winrm_transport": ("ntlm", "ansible_winrm_transport is an Ansible connection variable gpuops does not implement"),
        "ansible_ssh_extra_args": ("-o StrictHostKeyChecking=no", "StrictHostKeyChecking=no is refused: gpuops always verifies host keys"),
        "ansible_ssh_args": ("-o RemoteForward=8080:127.0.0.1:80", "ssh option RemoteForward is not supported"),
        "ansible_become_method": ("su", "ansible_become_method 'su' is not supported (gpuops becomes with sudo)"),
        "ansible_host_key_checking": (False, "ansible_host_key_checking: false is refused"),
    }
    logins_before = bastion_log.read_text().count("Connection from")
    for name, (value, expected) in cases.items():
        broken = dataclasses.replace(host, vars={**dict(host.vars), name: value})
        outcome = run_on_hosts([broken], lambda h: connect(h, ConnectOptions()).run("true"))[broken.name]
        assert not outcome.ok and expected in outcome.error, (name, outcome.error)
        assert "\n" not in outcome.error
    assert bastion_log.read_text().count("Connection from") == logins_before  # nobody was contacted


def test_a_failing_proxycommand_says_it_went_through_it(lab, empty_home: Path) -> None:
    host, _ = _behind_bastion(lab, empty_home)
    host = dataclasses.replace(host, vars={**dict(host.vars), "ansible_ssh_common_args": "-o ProxyCommand='false'"})
    outcome = run_on_hosts([host], lambda h: connect(h, ConnectOptions()).run("true"))[host.name]
    assert not outcome.ok and "through ProxyCommand 'false'" in outcome.error, outcome.error


# -- known_hosts markers: @revoked, @cert-authority (host certificates signed by a test CA) ------------


def _keygen(*args: str) -> None:
    import subprocess

    subprocess.run(["ssh-keygen", "-q", *args], check=True, capture_output=True, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def cert_hosts(lab, tmp_path_factory: pytest.TempPathFactory):
    """sshds whose host keys carry certificates: signed by our CA for 127.0.0.1, by another CA,
    for another name, and expired. Yields (dir, {case: port})."""
    import os
    import signal

    from gpuops.lab.sshd import generate_key, sshd_config_text, start_with_free_port

    root = tmp_path_factory.mktemp("certs")
    generate_key(root / "ca", "test CA")
    generate_key(root / "other_ca", "another CA")
    client_pub = Path(_hosts(lab)[0].key_file + ".pub")
    (root / "authorized_keys").write_text(client_pub.read_text())
    cases = {"good": ("ca", "127.0.0.1", "always:forever"), "other_ca": ("other_ca", "127.0.0.1", "always:forever"),
             "wrong_name": ("ca", "gpu99.example", "always:forever"), "expired": ("ca", "127.0.0.1", "20200101:20200102")}
    started, ports = [], {}
    try:
        for case, (ca, principal, validity) in cases.items():
            generate_key(root / f"{case}_host", case)
            _keygen("-s", str(root / ca), "-I", f"{case}-id", "-h", "-n", principal, "-V", validity, str(root / f"{case}_host.pub"))
            config = root / f"{case}.conf"

            def write(port: int, case: str = case, config: Path = config) -> None:
                text = sshd_config_text(port, root / f"{case}_host", root / f"{case}.pid", root / "authorized_keys",
                                        {"GPUOPS_CERT_CASE": case})
                config.write_text(text + f'HostCertificate "{root / f"{case}_host-cert.pub"}"\n')

            process = start_with_free_port(write, config, root / f"{case}.log", root / f"{case}.pid")
            started.append(process.pid)
            ports[case] = process.port
        yield root, ports
    finally:
        for pid in started:
            os.kill(pid, signal.SIGTERM)


def _cert_host(lab, port: int, known_hosts: Path) -> Host:
    base = _hosts(lab)[0]
    variables = {k: v for k, v in base.vars.items() if k != "gpuops_known_hosts"}
    variables["gpuops_known_hosts"] = str(known_hosts)
    return dataclasses.replace(base, name=f"cert{port}", port=port, vars=variables)


def _ca_line(root: Path, ca: str = "ca", pattern: str = "[127.0.0.1]:*") -> str:
    key_type, blob = (root / f"{ca}.pub").read_text().split()[:2]
    return f"@cert-authority {pattern} {key_type} {blob}\n"


def _try(host: Host, options: ConnectOptions | None = None):
    return run_on_hosts([host], lambda h: connect(h, options or ConnectOptions()).run("echo $GPUOPS_CERT_CASE").stdout)[host.name]


def test_a_host_certificate_signed_by_a_trusted_ca_is_accepted_without_its_key(lab, cert_hosts, tmp_path: Path) -> None:
    root, ports = cert_hosts
    known = tmp_path / "known_hosts"
    # A hashed plain line for some other host, then the CA: no plain key for this host anywhere.
    known.write_text("gpu77.example ssh-ed25519 " + (root / "other_ca.pub").read_text().split()[1] + "\n")
    _keygen("-H", "-f", str(known))
    known.write_text(known.read_text() + _ca_line(root))
    before = known.read_text()
    outcome = _try(_cert_host(lab, ports["good"], known), ConnectOptions(accept_new_host_keys=True))
    assert outcome.ok, outcome.error
    assert outcome.value == b"good\n"
    assert known.read_text() == before  # vouched for by the CA: nothing recorded


@pytest.mark.parametrize(("case", "expected"), [
    ("other_ca", "signed by a CA that no @cert-authority line for [127.0.0.1]:"),
    ("wrong_name", "is for gpu99.example, not 127.0.0.1"),
    ("expired", "is not valid now"),
])
def test_host_certificates_that_do_not_hold_are_refused(lab, cert_hosts, tmp_path: Path, case: str, expected: str) -> None:
    root, ports = cert_hosts
    known = tmp_path / "known_hosts"
    known.write_text(_ca_line(root))
    outcome = _try(_cert_host(lab, ports[case], known), ConnectOptions(accept_new_host_keys=True))
    assert not outcome.ok and expected in outcome.error, outcome.error
    assert known.read_text() == _ca_line(root)  # --accept-new-host-keys recorded nothing for a refused host


def test_a_revoked_ca_or_host_key_is_refused_even_when_also_trusted(lab, cert_hosts, tmp_path: Path) -> None:
    root, ports = cert_hosts
    known = tmp_path / "known_hosts"
    ca_type, ca_blob = (root / "ca.pub").read_text().split()[:2]
    known.write_text(_ca_line(root) + f"@revoked * {ca_type} {ca_blob}\n")
    outcome = _try(_cert_host(lab, ports["good"], known))
    assert not outcome.ok and "the CA that signed its certificate is REVOKED" in outcome.error, outcome.error
    # A plain host key, known AND revoked: refused, with the line that revokes it.
    host = _hosts(lab)[0]
    lab_known = Path(lab.known_hosts).read_text()
    line = next(l for l in lab_known.splitlines() if l.startswith(f"[127.0.0.1]:{host.port} "))
    revoked = tmp_path / "revoking"
    revoked.write_text(lab_known + "@revoked * " + " ".join(line.split()[1:3]) + "\n")
    variables = {**dict(host.vars), "gpuops_known_hosts": str(revoked)}
    outcome = run_on_hosts([dataclasses.replace(host, vars=variables)],
                           lambda h: connect(h, ConnectOptions()).run("true"))[host.name]
    assert not outcome.ok and "is REVOKED" in outcome.error and f"{revoked}:" in outcome.error, outcome.error


def test_hashed_known_hosts_with_marker_lines_still_verify(lab, tmp_path: Path) -> None:
    host = _hosts(lab)[0]
    known = tmp_path / "hashed"
    known.write_text(Path(lab.known_hosts).read_text())
    _keygen("-H", "-f", str(known))
    assert "[127.0.0.1]" not in known.read_text()
    known.write_text("@cert-authority *.nowhere.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
                     + known.read_text() + "@revoked * ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    variables = {**dict(host.vars), "gpuops_known_hosts": str(known)}
    conn = connect(dataclasses.replace(host, vars=variables), ConnectOptions())
    try:
        assert conn.run("echo ok").stdout == b"ok\n"
    finally:
        conn.close()


def test_proxyjump_in_ansible_ssh_common_args_verifies_the_jump_hosts_key(lab, empty_home: Path) -> None:
    bastion, target = _hosts(lab)
    (empty_home / ".ssh" / "config").write_text(f"Host 127.0.0.1\n  IdentityFile {bastion.key_file}\n")
    jump = f"-J {bastion.user}@127.0.0.1:{bastion.port}"
    host = dataclasses.replace(target, vars={**dict(target.vars), "ansible_ssh_common_args": jump})
    bastion_log = lab.host(bastion.name).dir / "sshd.log"
    hops_before = bastion_log.read_text().count("Accepted publickey")
    conn = connect(host, ConnectOptions())
    try:
        assert conn.run("echo $GPUOPS_LAB_HOST").stdout == f"{target.name}\n".encode()
    finally:
        conn.close()
    assert bastion_log.read_text().count("Accepted publickey") == hops_before + 1
    # The jump host's key is checked like any other: unknown there, the host fails before the hop.
    lines = [l for l in Path(lab.known_hosts).read_text().splitlines() if not l.startswith(f"[127.0.0.1]:{bastion.port} ")]
    (empty_home / "kh").write_text("\n".join(lines) + "\n")
    vars_ = {k: v for k, v in host.vars.items() if k != "gpuops_known_hosts"}
    vars_["gpuops_known_hosts"] = str(empty_home / "kh")
    outcome = run_on_hosts([dataclasses.replace(host, vars=vars_)], lambda h: connect(h, ConnectOptions()).run("true"))[host.name]
    assert not outcome.ok and f"host key for [127.0.0.1]:{bastion.port} is unknown" in outcome.error, outcome.error


# -- the openssh connection (the system's ssh, ControlMaster/ControlPersist) ------------------------


@pytest.fixture
def control_dir(monkeypatch: pytest.MonkeyPatch):
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="gcm")  # short: a unix socket path holds ~100 bytes
    monkeypatch.setenv("GPUOPS_SSH_CONTROL_DIR", path)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _openssh(host: Host, **extra) -> Host:
    return dataclasses.replace(host, vars={**dict(host.vars), "gpuops_connection": "openssh", **extra})


def test_openssh_connection_runs_one_exec_and_shares_the_connection(lab, control_dir: Path) -> None:
    host = _openssh(_hosts(lab)[0])
    log = lab.host(host.name).dir / "sshd.log"
    logins_before = log.read_text().count("Accepted publickey")
    conn = connect(host, ConnectOptions())
    try:
        program = b"#" * 300_000 + b"\nhead -c 2000000 /dev/zero | tr '\\0' y; echo; echo err >&2; exit 3\n"
        result = conn.run("sh -s", stdin=program, timeout=60)
        assert (result.exit_status, result.stdout, result.stderr) == (3, b"y" * 2_000_000 + b"\n", b"err\n")
        conn.close()
        again = connect(host, ConnectOptions())
        assert again.run("echo $GPUOPS_LAB_HOST").stdout == f"{host.name}\n".encode()
        # One login for both connections: the second went through the master (ControlPersist).
        assert log.read_text().count("Accepted publickey") == logins_before + 1
        assert len(list(control_dir.iterdir())) == 1
    finally:
        conn.stop_master()  # type: ignore[attr-defined]


def test_openssh_connection_verifies_host_keys_and_certificates(lab, cert_hosts, control_dir: Path, tmp_path: Path) -> None:
    unknown = _openssh(_without_lab_known_hosts(_hosts(lab)[0]))
    outcome = run_on_hosts([unknown], lambda h: connect(h, ConnectOptions()).run("true"))[unknown.name]
    assert not outcome.ok and "host key for 127.0.0.1 is unknown, changed or revoked" in outcome.error, outcome.error
    root, ports = cert_hosts
    known = tmp_path / "known_hosts"
    known.write_text(_ca_line(root))
    good = _openssh(_cert_host(lab, ports["good"], known))
    wrong = _openssh(_cert_host(lab, ports["other_ca"], known))
    outcomes = run_on_hosts([good, wrong], lambda h: connect(h, ConnectOptions()).run("echo $GPUOPS_CERT_CASE").stdout)
    assert outcomes[good.name].ok and outcomes[good.name].value == b"good\n", outcomes[good.name].error
    assert not outcomes[wrong.name].ok and "Host key verification failed" in outcomes[wrong.name].error
    for host in (good,):
        connect(host, ConnectOptions()).stop_master()  # type: ignore[attr-defined]


def test_openssh_connection_refuses_a_password_and_a_bad_persist(lab, control_dir: Path) -> None:
    base = _hosts(lab)[0]
    for extra, expected in [({"ansible_password": "pw-value"}, "ansible_password needs the paramiko connection"),
                            ({"gpuops_control_persist": "1; touch /tmp/x"}, "is not an ssh time"),
                            ({"gpuops_connection": "telnet"}, "gpuops_connection 'telnet' is not one of paramiko, openssh")]:
        host = _openssh(base, **extra)
        outcome = run_on_hosts([host], lambda h: connect(h, ConnectOptions()).run("true"))[host.name]
        assert not outcome.ok and expected in outcome.error, outcome.error
        assert "pw-value" not in outcome.error


def _negotiated(host: Host) -> tuple[str, str, tuple[str, ...]]:
    """The cipher and MAC agreed with sshd, and the key exchanges offered (paramiko keeps no record
    of the one agreed: offering a single one and connecting proves it)."""
    conn = connect(host, ConnectOptions())
    try:
        assert conn.run("true").exit_status == 0
        transport = conn._conn.transport  # type: ignore[attr-defined]
        return transport.local_cipher, transport.local_mac, tuple(transport.get_security_options().kex)
    finally:
        conn.close()


def test_fast_algorithms_are_negotiated_with_sshd_and_ssh_config_still_wins(lab, empty_home: Path) -> None:
    host = _hosts(lab)[0]
    cipher, _, kex = _negotiated(host)
    assert cipher == "aes128-gcm@openssh.com"  # AES-GCM ahead of paramiko's own CTR+HMAC default
    assert kex.index("curve25519-sha256@libssh.org") < kex.index("ecdh-sha2-nistp256")
    (empty_home / ".ssh" / "config").write_text(
        "Host *\n  Ciphers aes256-ctr\n  MACs hmac-sha2-512\n  KexAlgorithms ecdh-sha2-nistp256\n")
    assert _negotiated(host) == ("aes256-ctr", "hmac-sha2-512", ("ecdh-sha2-nistp256",))
    (empty_home / ".ssh" / "config").write_text("Host *\n  Ciphers chacha20-poly1305@openssh.com\n")
    outcome = run_on_hosts([host], lambda h: connect(h, ConnectOptions()).run("true"))[host.name]
    assert not outcome.ok and "ciphers 'chacha20-poly1305@openssh.com'" in outcome.error, outcome.error


def test_timings_show_connect_auth_and_exec_of_an_ssh_host(lab) -> None:
    import subprocess
    import sys

    name = _hosts(lab)[0].name
    done = subprocess.run([sys.executable, "-m", "gpuops.cli", "history", "-i", str(lab.inventory_path), "-l", name,
                           "--timings"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    shown = {tuple(line.split()[::3]) for line in done.stderr.splitlines() if line.startswith("  ")}
    for phase in ("ssh-import", "inventory", "startup", "imports", "other"):
        assert any(row[0] == phase for row in shown), done.stderr
    for phase in ("connect", "auth", "exec"):
        assert (phase, name) in shown, done.stderr
