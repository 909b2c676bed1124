"""The inspect document and the host answers it is made from are typed (issue 40): each ``...JSON``
``TypedDict`` of ``gpuops/facts`` names exactly the keys the document has, in its order, and every
value a parser hands on is of the type its field declares, however a host answers. A field typed
narrower than its parser checks it (a package ``version`` passed on as the host sent it, a number
where text is declared) fails here with the path of the value."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Union, get_args, get_origin, get_type_hints, is_typeddict

from facts_fixtures import KIMI, RTX8, b64, fixture_text, ok, server_output
from labtools import REPO_ROOT

from gpuops.desired_state import ComposedLaunch, composed, read_desired
from gpuops.facts.collect import HostInspection, HostJSON, host_json
from gpuops.facts.container_python import ContainerFacts, parse_container
from gpuops.facts.gpu import Gpu, GpuEntryJSON, parse_banner, parse_query
from gpuops.facts.host import host_facts
from gpuops.facts.managed import ManagedLaunch, parse_managed
from gpuops.facts.served_model import ModelFacts, ModelJSON, model_from_config
from gpuops.facts.server import DockerContainerFacts, SystemdUnitFacts, parse_server
from gpuops.facts.server_json import DockerJSON, SystemdJSON
from gpuops.facts.server_report import ServerReport, parse_report
from gpuops.facts.software import PythonPackages, parse_host_system, parse_python_packages
from gpuops.facts.to_json import FactsJSON
from gpuops.facts.topology import GpuAffinity, NumaJSON, parse_p2p, parse_topo
from gpuops.gather import ProbeOutput
from gpuops.transport import HostOutcome


def mismatches(value: object, hint: object, path: str = "$") -> list[str]:
    """Where ``value`` is not of type ``hint`` (``[]``: it is). TypedDicts must have exactly their
    declared keys (the optional ones may be missing); dataclasses are checked field by field."""
    if hint is object or hint is typing.Any:
        return []
    if hint is None or hint is type(None):
        return [] if value is None else [f"{path}: {value!r} is not None"]
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        found = [mismatches(value, option, path) for option in get_args(hint)]
        return [] if any(not f for f in found) else [f"{path}: {value!r} is none of {hint}"]
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not an object"]
        hints = get_type_hints(hint)
        required = getattr(hint, "__required_keys__", frozenset(hints))
        out = [f"{path}.{key}: missing" for key in sorted(required - set(value))]
        out += [f"{path}.{key}: not declared" for key in value if key not in hints]
        for key, item in value.items():
            if key in hints:
                out += mismatches(item, hints[key], f"{path}.{key}")
        return out
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            return [f"{path}: {value!r} is not a {hint}"]
        hints = get_type_hints(hint)
        return [m for f in dataclasses.fields(hint) for m in mismatches(getattr(value, f.name), hints[f.name], f"{path}.{f.name}")]
    if origin in (list, tuple):
        kind = origin
        if not isinstance(value, kind):
            return [f"{path}: {value!r} is not a {kind.__name__}"]
        args = get_args(hint)
        if kind is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return [m for i, (v, a) in enumerate(zip(value, args)) for m in mismatches(v, a, f"{path}[{i}]")]
        return [m for i, v in enumerate(value) for m in mismatches(v, args[0], f"{path}[{i}]")]
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            return [f"{path}: {value!r} is not a mapping"]
        key_type, value_type = get_args(hint)
        return [m for k, v in value.items() for m in mismatches(k, key_type, f"{path} key") + mismatches(v, value_type, f"{path}.{k}")]
    if isinstance(hint, type):
        if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return []
        if isinstance(value, bool) and hint is not bool:
            return [f"{path}: {value!r} is not a {hint.__name__}"]
        return [] if isinstance(value, hint) else [f"{path}: {value!r} is not a {hint.__name__}"]
    raise AssertionError(f"{path}: this test cannot check {hint!r}; teach mismatches()")


def _keys_in_order(typed: type) -> list[str]:
    return list(get_type_hints(typed))


def test_each_record_json_names_its_facts_fields_in_order() -> None:
    """A field added to a fact's dataclass is added to its JSON type (and the document) too."""
    for record, typed in ((Gpu, GpuEntryJSON), (ModelFacts, ModelJSON), (GpuAffinity, NumaJSON),
                          (SystemdUnitFacts, SystemdJSON), (DockerContainerFacts, DockerJSON)):
        assert [f.name for f in dataclasses.fields(record)] == _keys_in_order(typed), typed.__name__


DOCKER = {"id": "0123456789abcdef", "name": "/sglang", "image": "lmsysorg/sglang:v0.5.21", "image_id": "sha256:ab",
          "cmd": ["python3", "-m", "sglang.launch_server"], "entrypoint": None, "restart_count": 2,
          "state": {"Status": "running", "Health": {"Status": "healthy"}}, "network_mode": "host",
          "mounts": [{"Destination": "/models"}]}
SYSTEMD = ("Id=sglang.service\nActiveState=active\nSubState=running\nMainPID=4242\nNRestarts=0\n"
           "ExecStart={ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m sglang.launch_server ; }\n"
           "Environment=NCCL_P2P_LEVEL=SYS\nFragmentPath=/etc/systemd/system/sglang.service\nUser=sglang\nRestart=always\n")
REPORT = {"route": "/server_info", "version": "0.5.21", "launch_command": "python3 -m sglang.launch_server",
          "settings": {"attention_backend": "flashinfer", "speculative_algorithm": "EAGLE3", "enable_metrics": True},
          "metrics_route": True, "in_flight": {"running": 1, "waiting": 0, "total": 1, "source": "/metrics"}}
CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
          "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "n_routed_experts": 384, "torch_dtype": "bfloat16",
                          "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}}
PACKAGES = {"python": {"executable": "/usr/bin/python3.12", "version": "3.12.3", "path": ["/usr/lib/python3.12"]},
            "packages": {"sglang": {"version": "0.5.21", "path": "/x/sglang", "source": "metadata",
                                    "requires": ["torch==2.9.1"]},
                         "torch": {"version": "2.9.1", "path": "/x/torch", "source": "metadata", "cuda": "12.8",
                                   "version_full": "2.9.1+cu128"},
                         "nvidia-nccl-cu13": None},
            "nccl": {"version": "2.27.5", "source": "nvidia-nccl-cu12", "path": "/x"},
            "kernels": {"flashinfer": {"archs": ["sm90"]}}}
SYSTEM = "kernel=6.8.0\nmachine=x86_64\nos=\"Ubuntu 24.04\"\npython3=/usr/bin/python3\nchosen_python=/usr/bin/python3.12\n"


def _server(docker: object, systemd: str, report: object, config: object) -> ProbeOutput:
    extra = "".join(f"{key}={b64(text.encode())}\n" for key, text in (
        ("docker_b64", json.dumps(docker)), ("docker_digests_b64", json.dumps(["lmsysorg/sglang@sha256:cd"])),
        ("systemd_b64", systemd), ("reported_b64", json.dumps(report)), ("config_b64", json.dumps(config))))
    return server_output(KIMI, extra=extra + "config_path=/models/Kimi-K2.5/config.json\n")


def _desired() -> str:
    """A recorded desired.json answer with a release in effect and two release environments."""
    return (REPO_ROOT / "tests" / "facts" / "gpuops.desired" / "release.json").read_text(encoding="utf-8")


def _host(server: ProbeOutput, packages: object, desired: str) -> HostJSON:
    values = {
        "gpu.query": parse_query(ok(fixture_text(RTX8, "query.csv"))),
        "gpu.banner": parse_banner(ok("| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |\n")),
        "gpu.topo": parse_topo(ok(fixture_text(RTX8, "topo.txt"))),
        "gpu.p2p": parse_p2p(ok(fixture_text(RTX8, "p2p.txt"))),
        "host.system": parse_host_system(ok(SYSTEM)),
        "software.python": parse_python_packages(ok(json.dumps(packages))),
        "server": parse_server(server),
        "gpuops.desired": parse_managed(ok(json.loads(desired)["stdout"])),
    }
    inspection = HostInspection(facts=host_facts(values), recovered=("rolled back run r1",),
                                gate_scan={"cached": True, "fingerprint": "ab12"})
    return host_json(HostOutcome(ok=True, value=inspection))


def test_a_whole_host_entry_is_of_its_type() -> None:
    """Every part of the document present (systemd, docker, the server's report, the model, a
    managed launch with release environments): each key declared, each value of its type."""
    entry = _host(_server(DOCKER, SYSTEMD, REPORT, CONFIG), PACKAGES, _desired())
    facts = entry["facts"]
    assert facts is not None and facts["server"]["docker"] and facts["server"]["systemd"] and facts["server"]["reported"]
    assert facts["model"] is not None and facts["model"]["known"] and entry["managed_launch"]
    assert mismatches(entry, HostJSON) == []
    # the document's key order is the type's, but for "schema" first (FactsJSON extends the GPU keys)
    assert list(facts) == ["schema", *[key for key in _keys_in_order(FactsJSON) if key != "schema"]]
    assert mismatches(json.loads(json.dumps(entry)), HostJSON) == []


def test_a_failed_host_entry_is_of_its_type() -> None:
    assert mismatches(host_json(HostOutcome(ok=False, error="ssh: connection refused")), HostJSON) == []


# Every answer a host may give where a parser reads JSON, of the wrong kind at each place it is read.
ODD_PACKAGES = {"python": ["not", "an", "object"],
                "packages": {"sglang": {"version": 21, "path": ["x"], "source": None, "requires": "torch"},
                             "torch": {"version": None, "cuda": 12.8, "version_full": {"x": 1}}},
                "nccl": "2.27", "kernels": ["x"]}
ODD_DOCKER = {"id": 5, "name": None, "cmd": "python3", "entrypoint": {"a": 1}, "restart_count": True,
              "state": {"Status": 1, "Health": {"Status": 7}}, "mounts": ["x", {"Destination": 3}]}
ODD_REPORT = {"route": 7, "version": 0.5, "settings": ["x"], "metrics_route": "yes", "in_flight": "many", "error": None}
ODD_CONFIG = {"architectures": "Kimi", "model_type": 3, "hidden_size": "7168", "num_hidden_layers": True,
              "torch_dtype": 16, "quantization_config": {"quant_method": 8, "weight_block_size": [128, "x"]}}


def test_odd_host_answers_still_give_values_of_their_declared_types() -> None:
    entry = _host(_server(ODD_DOCKER, SYSTEMD, ODD_REPORT, ODD_CONFIG), ODD_PACKAGES, _desired())
    assert mismatches(entry, HostJSON) == []
    assert mismatches(parse_python_packages(ok(json.dumps(ODD_PACKAGES))), PythonPackages) == []
    assert mismatches(parse_python_packages(ok("[1, 2]")), PythonPackages) == []
    assert mismatches(parse_report(json.dumps(ODD_REPORT).encode()), ServerReport) == []
    assert mismatches(model_from_config("/m", None, json.dumps(ODD_CONFIG).encode()), ModelFacts) == []


def test_odd_container_and_desired_state_answers_are_of_their_types() -> None:
    container = ok(json.dumps([{"Name": 5, "Id": "c1", "Image": "sha256:ab", "Config": ["x"], "State": None}])
                   + "\n" + json.dumps([{"Config": {"Labels": ["x"]}}]))
    assert mismatches(parse_container(container), ContainerFacts) == []
    odd = json.dumps({"contributions": {"a": {"args": "--tp 2", "env": ["X=1"], "drop": 5, "renames": ["x"],
                                              "python": "/p", "image": 3, "run_id": 7},
                                        "b": {"args": ["--tp", 2], "env": {"X": 1}, "renames": {"--a": "b"}}}})
    assert mismatches(composed(read_desired(odd, "desired.json")), ComposedLaunch) == []
    stdout = odd + "\n\n#--gpuops-envs--\n/opt/envs/sglang-1/.gpuops-env.json\n{\"version\": 1}\n"
    assert mismatches(parse_managed(ok(stdout)), ManagedLaunch | None) == []
