"""apply/replicas.py offline: which hosts are replicas, their URLs, the checks made before any host."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops import multi_node
from gpuops.apply import deployment_health, replicas
from gpuops.apply.extra_vars import ExtraVars
from gpuops.errors import GpuopsError
from gpuops.inventory import Host
from gpuops.plan import varcheck
from gpuops.transport import address


def _host(name: str, address: str | None = "10.0.0.1", **variables: object) -> Host:
    return Host(name=name, address=address, port=None, user=None, key_file=None, connection="ssh", groups=("all",),
                vars=dict(variables))


def test_normal_url_compares_as_the_router_lists_workers() -> None:
    assert replicas.normal_url("HTTP://Node1:30000/") == "http://node1:30000"
    assert replicas.normal_url("http://node1") == "http://node1:80"
    assert replicas.normal_url("http://[::1]:8000") == "http://[::1]:8000"
    with pytest.raises(ValueError):
        replicas.normal_url("node1:30000")


def test_a_host_without_a_router_is_no_replica() -> None:
    assert replicas.replica_for(_host("a"), {}) is None
    assert replicas.replica_for(_host("a"), {"sglang_router_url": ""}) is None  # -e emptied it


def test_the_worker_url_is_the_address_and_sglang_port_unless_given() -> None:
    replica = replicas.replica_for(_host("a"), {"sglang_router_url": "http://gw:30550/", "sglang_port": 30001})
    assert replica is not None
    assert replica.worker_url == "http://10.0.0.1:30001" and replica.router.url == "http://gw:30550"
    assert replica.drain_timeout_s == 120 and replica.healthy_timeout_s == 60
    given = replicas.replica_for(_host("a"), {"sglang_router_url": "http://gw:30550",
                                              "sglang_worker_url": "http://a.internal:30000",
                                              "sglang_drain_timeout": "30"})
    assert given is not None and given.worker_url == "http://a.internal:30000" and given.drain_timeout_s == 30


def test_the_router_itself_is_never_taken_out() -> None:
    with pytest.raises(GpuopsError, match="the router itself is never taken out"):
        replicas.replica_for(_host("gw", address="gw"), {"sglang_router_url": "http://gw:30000"})


@pytest.mark.parametrize("variables, message", [
    ({"sglang_router_url": "gw:30550"}, "sglang_router_url: 'gw:30550' is not an http"),
    ({"sglang_router_url": "http://gw:1", "sglang_drain_timeout": "soon"}, "sglang_drain_timeout must be a number"),
    ({"sglang_router_url": "http://gw:1", "sglang_drain_timeout": 0}, "must be above 0"),
    ({"sglang_router_url": 5}, "sglang_router_url must be a URL"),
])
def test_bad_replica_variables_are_one_clear_error_naming_the_host(variables: dict, message: str) -> None:
    with pytest.raises(GpuopsError, match=message) as caught:
        replicas.replica_for(_host("a"), variables)
    assert str(caught.value).startswith("a: ")


def test_look_alike_replicas_rolled_without_a_router_are_warned_about() -> None:
    hosts = [_host(n, sglang_args=["--model-path", f"/data/{n}/Kimi-K2.5", "--tp", "8"]) for n in ("a", "b")]
    hosts.append(_host("c", sglang_args=["--model-path", "/models/other"]))
    warnings = replicas.replica_warnings(hosts, ExtraVars.none(), {}, rolling=True)
    assert set(warnings) == {"a", "b"} and "a, b serve the same model (Kimi-K2.5)" in warnings["a"]
    assert replicas.replica_warnings(hosts, ExtraVars.none(), {}, rolling=False) == {}
    named = {"a": object(), "b": object()}
    assert replicas.replica_warnings(hosts, ExtraVars.none(), named, rolling=True) == {}  # type: ignore[arg-type]


def test_preflight_of_hosts_without_routers_asks_nothing() -> None:
    assert replicas.preflight([_host("a"), _host("b")], ExtraVars.none()) == {}


def test_the_variable_check_knows_every_replica_variable() -> None:
    assert set(varcheck.RUN_VARIABLES) == {replicas.ROUTER_VAR, replicas.WORKER_URL_VAR, replicas.ROUTER_KEY_VAR,
                                           replicas.DRAIN_VAR, replicas.ROUTER_HEALTH_VAR,
                                           multi_node.DEPLOYMENT_VAR, multi_node.RANK_VAR, multi_node.DIST_PORT_VAR,
                                           deployment_health.ANSWER_VAR}


def _alias_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ssh config as the operator's own: ``box`` is an alias whose HostName is 10.9.8.7."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host box\n  HostName 10.9.8.7\n  User ops\nHost *\n  ServerAliveInterval 30\n")
    monkeypatch.setenv("HOME", str(home))


@pytest.mark.parametrize("host, url", [
    (_host("box", address=None), "http://10.9.8.7:30001"),          # the ssh-config alias's HostName
    (_host("box", address="192.168.1.5"), "http://192.168.1.5:30001"),  # ansible_host wins over the alias
    (_host("plain", address=None), "http://plain:30001"),            # no HostName: the name ssh resolves
    (_host("box", address=None, ansible_ssh_common_args="-o HostName=10.0.0.42"), "http://10.0.0.42:30001"),
    (_host("v6", address="fd00::7"), "http://[fd00::7]:30001"),
])
def test_the_worker_url_defaults_to_the_address_gpuops_connects_to(host: Host, url: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _alias_config(tmp_path, monkeypatch)
    replica = replicas.replica_for(host, {"sglang_router_url": "http://gw:30550", "sglang_port": 30001})
    assert replica is not None and replica.worker_url == url
    # sglang_worker_url stays the override
    given = replicas.replica_for(host, {"sglang_router_url": "http://gw:30550", "sglang_port": 30001,
                                        "sglang_worker_url": "http://front.internal:9"})
    assert given is not None and given.worker_url == "http://front.internal:9"


def test_connect_address_skips_a_config_file_it_cannot_read(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_bytes(b"Host box\n  HostName \xff\xfe\n")
    good = tmp_path / "good"
    good.write_text("Host box\n  HostName 10.9.8.7\n")
    assert address.ssh_config_hostname("box", (str(tmp_path / "absent"), str(broken), str(good))) == "10.9.8.7"
    assert address.ssh_config_hostname("other", (str(good),)) is None
