"""The ``server`` key of the inspect document (docs/inspect-json.md) and the report's server lines,
from the server fact (``facts/server.py``): keys are only ever added, as typed here."""

from __future__ import annotations

from typing import TypedDict

from gpuops.facts.served_model import ModelJSON
from gpuops.facts.server import ServerFacts
from gpuops.facts.server_args import Flags, SpeculativeFlags
from gpuops.facts.server_report import ReportJSON, report_json, report_lines
from gpuops.facts.speculative import SpeculativeJSON, judge


class OtherServerJSON(TypedDict):
    pid: int
    port: int


class SystemdJSON(TypedDict):
    """``server.systemd``: a ``SystemdUnitFacts``, key for key."""

    unit: str
    active_state: str
    sub_state: str
    main_pid: int | None
    n_restarts: int | None
    exec_start: str
    exec_argv: str | None
    environment: list[str]
    environment_files: list[str]
    drop_ins: list[str]
    fragment_path: str
    user: str
    working_directory: str
    restart: str


class DockerJSON(TypedDict):
    """``server.docker``: a ``DockerContainerFacts``, key for key."""

    id: str
    name: str
    image: str
    image_id: str
    repo_digests: list[str]
    cmd: list[str]
    entrypoint: list[str]
    status: str
    health: str | None
    restart_count: int | None
    network_mode: str
    mounts: list[str]
    env: dict[str, str]


class ServerJSON(TypedDict):
    """The ``server`` key of the inspect document (``server_json``; ``facts_json`` adds
    ``python_version``)."""

    known: bool
    reason: str | None
    running: bool
    pid: int | None
    port: int | None
    want_port: int | None
    args: Flags | None
    argv: list[str] | None
    model_path: str | None
    tp_size: int | None
    dp_size: int | None
    ep_size: int | None
    pp_size: int | None
    speculative: SpeculativeFlags | None
    fusion_flags: Flags | None
    enable_flashinfer_allreduce_fusion: bool | None
    disable_custom_all_reduce: bool | None
    attention_backend: str | None
    quantization: str | None
    env: dict[str, str] | None
    env_reason: str | None
    healthy: bool | None
    health_status: int | None
    health_error: str | None
    health_url: str | None
    manager: str | None
    unit: str | None
    python: str | None
    others: list[OtherServerJSON]
    notes: list[str]
    systemd: SystemdJSON | None
    docker: DockerJSON | None
    reported: ReportJSON | None
    metrics_enabled: bool | None
    speculative_in_effect: SpeculativeJSON


def server_json(server: ServerFacts) -> ServerJSON:
    """The ``server`` key of the inspect document (docs/inspect-json.md): only ever added to."""
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
        "reported": _reported_json(server),
        "metrics_enabled": server.metrics_enabled,
        "speculative_in_effect": _speculative_json(server),
    }


def _speculative_json(server: ServerFacts) -> SpeculativeJSON:
    """Speculative decoding as the server runs it: its resolved settings first (``facts/speculative.py``)."""
    settings = server.settings
    return judge(settings.speculative if settings else None, _reported_json(server),
                 bool(server.known and server.running)).to_json()


def _reported_json(server: ServerFacts) -> ReportJSON | None:
    return report_json(server.reported)


def _docker_json(server: ServerFacts) -> DockerJSON | None:
    box = server.docker
    if box is None:
        return None
    return {
        "id": box.id, "name": box.name, "image": box.image, "image_id": box.image_id,
        "repo_digests": list(box.repo_digests), "cmd": list(box.cmd), "entrypoint": list(box.entrypoint),
        "status": box.status, "health": box.health, "restart_count": box.restart_count,
        "network_mode": box.network_mode, "mounts": list(box.mounts), "env": dict(box.env),
    }


def _systemd_json(server: ServerFacts) -> SystemdJSON | None:
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


def server_lines(server: ServerJSON, model: ModelJSON | None) -> list[str]:
    """The report's server lines, from the inspect document (``server_json``, ``model_json``)."""
    if not server["known"]:
        return [f"unknown ({server['reason']})"]
    if not server["running"]:
        lines = list(server["notes"]) or [f"no SGLang server on port {server['want_port']}"]
        if server["healthy"]:
            lines.append(f"but something answers {server['health_url']} (a server gpuops cannot see: another user's, a container's?)")
        return lines
    health = "healthy" if server["healthy"] else f"NOT healthy ({server['health_status'] or server['health_error']})"
    managed = (server["manager"] or "unknown") + (f" ({server['unit']})" if server["unit"] else "")
    lines = [f"pid {server['pid']}, port {server['port']}, {health}, managed by {managed}"]
    unit = server.get("systemd")
    if unit:
        lines.append(f"systemd: {unit['unit']} {unit['active_state']}/{unit['sub_state']}, main pid {unit['main_pid']}, "
                     f"restarts {unit['n_restarts']}, Restart={unit['restart']}"
                     + (f", User={unit['user']}" if unit["user"] else "")
                     + (f", env files {' '.join(unit['environment_files'])}" if unit["environment_files"] else "")
                     + (f", drop-ins {' '.join(unit['drop_ins'])}" if unit["drop_ins"] else ""))
    box = server.get("docker")
    if box:
        lines.append(f"docker: container {box['name']} ({box['id'][:12]}) {box['status']}, image {box['image']} "
                     f"({box['image_id'][:19]}), restarts {box['restart_count']}"
                     + (f", health {box['health']}" if box["health"] else "")
                     + (f", network {box['network_mode']}" if box["network_mode"] else ""))
    if server["args"] is None:
        return lines + list(server["notes"])
    sizes = (("dp", server["dp_size"]), ("ep", server["ep_size"]), ("pp", server["pp_size"]))
    parallel = f"tp {server['tp_size']}" + "".join(f", {k} {size}" for k, size in sizes if (size or 1) > 1)
    spec = server["speculative"]
    if spec:
        parallel += (f"; speculative {spec['algorithm']} (steps {spec['num_steps']}, topk {spec['eagle_topk']}, "
                     f"draft tokens {spec['num_draft_tokens']})")
    fusion = ", ".join(f"{k}={v}" for k, v in (server["fusion_flags"] or {}).items()) or "none"
    lines.append(f"{parallel}; fusion flags: {fusion}")
    if model:
        if model["known"]:
            lines.append(f"model {model['path']}: {model['architecture']}, hidden {model['hidden_size']}, "
                         f"{model['num_hidden_layers']} layers")
        else:
            lines.append(f"model {model['path']}: {model['reason']}")
    lines.extend(report_lines(server.get("reported"), server.get("metrics_enabled")))
    speculative = server.get("speculative_in_effect") or {}
    if speculative.get("in_effect") or speculative.get("disagreements") or server.get("speculative"):
        lines.append(f"speculative decoding {speculative['reason']}")
    if server["env"] is None:
        lines.append(f"environment unknown: {server['env_reason']}")
    else:
        env = " ".join(f"{k}={v}" for k, v in sorted(server["env"].items()))
        lines.append(f"env: {env or '(no NCCL_/SGLANG_/CUDA_ variables)'}")
    lines.extend(server["notes"])
    return lines
