"""HostFacts -> the stable JSON shape documented in docs/inspect-json.md (pure).

The shape is a contract with scripts and with other parts of gpuops (gates, bench): keys are only
ever added, never renamed or removed. Keep this file and the document in step.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gpuops.facts.gpu import gpu_json
from gpuops.facts.host import HostFacts
from gpuops.facts.served_model import ModelFacts
from gpuops.facts.server import ServerFacts
from gpuops.facts.software import PackageInfo
from gpuops.facts.topology import interconnect_json

SCHEMA_VERSION = 1

# JSON key -> distribution name
_PACKAGE_KEYS = (("sglang", "sglang"), ("flashinfer", "flashinfer-python"), ("sgl_kernel", "sgl-kernel"),
                 ("sglang_kernel", "sglang-kernel"), ("torch", "torch"))


def _package(info: PackageInfo | None, with_cuda: bool = False) -> dict[str, Any] | None:
    if info is None:
        return None
    out: dict[str, Any] = {"version": info.version, "path": info.path, "source": info.source}
    if with_cuda:
        out["cuda"] = info.cuda
        out["version_full"] = info.version_full
    if info.requires is not None:
        out["requires"] = list(info.requires)  # sglang: its own pins of the stack packages
    return out


def _model(model: ModelFacts | None) -> dict[str, Any] | None:
    if model is None:
        return None
    data = asdict(model)
    data["architectures"] = list(model.architectures)
    return data


def server_json(server: ServerFacts) -> dict[str, Any]:
    settings = server.settings
    return {
        "known": server.known,
        "reason": server.reason,
        "running": server.running,
        "pid": server.pid,
        "port": settings.port if settings else server.want_port,
        "want_port": server.want_port,
        "args": dict(settings.args) if settings else None,
        "argv": list(server.argv) if server.running else None,
        "model_path": settings.model_path if settings else None,
        "tp_size": settings.tp_size if settings else None,
        "dp_size": settings.dp_size if settings else None,
        "ep_size": settings.ep_size if settings else None,
        "pp_size": settings.pp_size if settings else None,
        "speculative": settings.speculative if settings else None,
        "fusion_flags": dict(settings.fusion_flags) if settings else None,
        "enable_flashinfer_allreduce_fusion": settings.enable_flashinfer_allreduce_fusion if settings else None,
        "disable_custom_all_reduce": settings.disable_custom_all_reduce if settings else None,
        "attention_backend": settings.attention_backend if settings else None,
        "quantization": settings.quantization if settings else None,
        "env": dict(server.env) if server.env is not None else None,
        "env_reason": server.env_reason,
        "healthy": server.healthy,
        "health_status": server.health_status,
        "health_error": server.health_error,
        "health_url": server.health_url,
        "manager": server.manager,
        "unit": server.unit,
        "python": server.python,
        "others": [{"pid": pid, "port": port} for pid, port in server.others],
        "notes": list(server.notes),
        "systemd": _systemd_json(server),
        "docker": _docker_json(server),
    }


def _docker_json(server: ServerFacts) -> dict[str, Any] | None:
    box = server.docker
    if box is None:
        return None
    return {
        "id": box.id, "name": box.name, "image": box.image, "image_id": box.image_id,
        "repo_digests": list(box.repo_digests), "cmd": list(box.cmd), "entrypoint": list(box.entrypoint),
        "status": box.status, "health": box.health, "restart_count": box.restart_count,
        "network_mode": box.network_mode, "mounts": list(box.mounts), "env": dict(box.env),
    }


def _systemd_json(server: ServerFacts) -> dict[str, Any] | None:
    unit = server.systemd
    if unit is None:
        return None
    return {
        "unit": unit.unit, "active_state": unit.active_state, "sub_state": unit.sub_state,
        "main_pid": unit.main_pid, "n_restarts": unit.n_restarts, "exec_start": unit.exec_start,
        "exec_argv": unit.exec_argv, "environment": list(unit.environment),
        "environment_files": list(unit.environment_files), "drop_ins": list(unit.drop_ins),
        "fragment_path": unit.fragment_path, "user": unit.user, "working_directory": unit.working_directory,
        "restart": unit.restart,
    }


def _server_python_version(facts: HostFacts) -> str | None:
    """The server's python version, known when the probes ran with the server's own interpreter."""
    reason = facts.system.chosen_python_reason or ""
    if facts.server.running and reason.startswith("the running SGLang server's interpreter"):
        return facts.packages.python_version
    return None


def facts_json(facts: HostFacts) -> dict[str, Any]:
    system = facts.system
    pk = facts.packages
    software: dict[str, Any] = {
        "known": pk.known,
        "reason": pk.reason,
        "os": system.os,
        "kernel": system.kernel,
        "machine": system.machine,
        "python": {
            "executable": pk.python_executable or system.chosen_python,
            "version": pk.python_version,
            "chosen_because": system.chosen_python_reason,
        },
        "host_python3": {"path": system.python3, "version": system.python3_version},
    }
    for key, dist in _PACKAGE_KEYS:
        software[key] = _package(pk.packages.get(dist), with_cuda=key == "torch")
    software["nccl"] = _package(pk.nccl)
    return {
        "schema": SCHEMA_VERSION,
        **gpu_json(facts.gpu, facts.banner),
        "interconnect": interconnect_json(facts.interconnect),
        "software": software,
        "server": {**server_json(facts.server), "python_version": _server_python_version(facts)},
        "model": _model(facts.server.model),
        "warnings": list(facts.warnings),
    }
