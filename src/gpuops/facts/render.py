"""Human report of one host's facts, from the JSON document (so both views always agree).

Writes through a rich Console; tables are rich tables on a terminal and plain aligned text
otherwise, so a piped report stays readable and greppable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuops.facts.gpu import GPU_HEADERS, gpu_heading, gpu_rows
from gpuops.facts.topology import interconnect_line, numa_line
from gpuops.output import format_table, rich_table

if TYPE_CHECKING:
    from rich.console import Console


def _say(console: Console, text: str, style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False)


def _table(console: Console, headers: list[str], rows: list[list[Any]]) -> None:
    if console.is_terminal:
        console.print(rich_table(headers, rows))
    else:
        _say(console, format_table(headers, rows, indent="  "))


def _pkg(name: str, info: dict[str, Any] | None) -> str:
    if not info:
        return f"{name} -"
    text = f"{name} {info.get('version_full') or info.get('version') or '?'}"
    if info.get("cuda"):
        text += f" (CUDA {info['cuda']})"
    return text


def software_lines(sw: dict[str, Any]) -> list[str]:
    py = sw["python"]
    host_py = sw["host_python3"]
    lines = [
        f"{sw['os'] or 'unknown OS'}, kernel {sw['kernel'] or '?'}, host python3 "
        f"{host_py['version'] or '-'}",
    ]
    if sw["known"]:
        lines.append(f"python {py['version']} {py['executable']} ({py['chosen_because'] or 'chosen'})")
        nccl = sw["nccl"]
        nccl_text = f"NCCL {nccl['version']} ({nccl['source']})" if nccl else "NCCL -"
        lines.append(", ".join([_pkg("sglang", sw["sglang"]), _pkg("flashinfer", sw["flashinfer"]),
                                _pkg("sgl-kernel", sw["sgl_kernel"]), _pkg("torch", sw["torch"]), nccl_text]))
        if sw["sglang"] and sw["sglang"].get("path"):
            lines.append(f"sglang at {sw['sglang']['path']}")
    else:
        lines.append(f"packages unknown: {sw['reason']}")
    return lines


def server_lines(server: dict[str, Any], model: dict[str, Any] | None) -> list[str]:
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
    parallel = f"tp {server['tp_size']}" + "".join(
        f", {k} {server[k + '_size']}" for k in ("dp", "ep", "pp") if (server.get(k + "_size") or 1) > 1)
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
    if server["env"] is None:
        lines.append(f"environment unknown: {server['env_reason']}")
    else:
        env = " ".join(f"{k}={v}" for k, v in sorted(server["env"].items()))
        lines.append(f"env: {env or '(no NCCL_/SGLANG_/CUDA_ variables)'}")
    lines.extend(server["notes"])
    return lines


def render_host_facts(console: Console, facts: dict[str, Any]) -> None:
    """The facts part of one host's report (the caller prints the header and the gates)."""
    if facts["gpu_status"]["known"]:
        _say(console, gpu_heading(facts), style="bold")
        _table(console, GPU_HEADERS, gpu_rows(facts))
        if facts["gpu_status"].get("note"):
            _say(console, f"  note: {facts['gpu_status']['note']}", style="yellow")
    else:
        _say(console, gpu_heading(facts), style="yellow")
    ic = facts["interconnect"]
    _say(console, f"interconnect: {interconnect_line(ic)}")
    numa = numa_line(ic)
    if numa:
        _say(console, f"NUMA: {numa}")
    for i, line in enumerate(software_lines(facts["software"])):
        _say(console, ("software: " if i == 0 else "  ") + line)
    for i, line in enumerate(server_lines(facts["server"], facts["model"])):
        _say(console, ("server: " if i == 0 else "  ") + line)
    for warning in facts["warnings"]:
        _say(console, f"warning: {warning}", style="yellow")
