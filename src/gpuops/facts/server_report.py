"""What the running server says about itself (``remote/server_report.py``, run on the host by the
server probe through the one server client): its resolved settings from ``/server_info`` (or the
``/get_server_info`` of a release that has only that), its version and ``launch_command``, whether
``/metrics`` answers, and how many requests it holds.

Everything in it passed the secrets policy (``secret_policy.mask_reported``) before it is kept:
a server reports its ``api_key`` and its command line in plain text.

``settings`` are the truth about what the server runs with (SGLang's own decisions applied):
``gates/in_effect.py`` believes them before its own judgement of the gates.
"""

from __future__ import annotations

import json
from dataclasses import field
from typing import TypedDict
from gpuops.secret_policy import mask_reported
from gpuops.frozen import frozen

# The settings the report's line names (and in_effect reads): what decides the verify step's speed.
HEADLINE = ("attention_backend", "enable_flashinfer_allreduce_fusion", "flashinfer_allreduce_fusion_backend",
            "disable_custom_all_reduce", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "enable_metrics")


class ReportJSON(TypedDict):
    """The ``server.reported`` key of the inspect document (``report_json``); ``settings`` and
    ``in_flight`` as the server sent them (masked): read each value as what it is checked to be."""

    route: str | None
    version: str | None
    settings: dict[str, object]
    launch_command: str | None
    metrics_route: bool | None
    in_flight: dict[str, object] | None
    error: str | None


@frozen
class ServerReport:
    """What the running server says about itself (``parse_report``, masked): its resolved settings, version and
    launch command, whether ``/metrics`` answers, and the requests it holds."""

    route: str | None                       # the route that answered: /server_info or /get_server_info
    settings: dict[str, object] = field(default_factory=dict)
    version: str | None = None
    launch_command: str | None = None       # masked
    metrics_route: bool | None = None       # /metrics answered (None: not asked, or it failed)
    in_flight: dict[str, object] | None = None  # {"running", "waiting", "total", "source"}
    error: str | None = None

    @property
    def metrics_enabled(self) -> bool | None:
        """The server's own word (``enable_metrics``), else whether ``/metrics`` answered."""
        value = self.settings.get("enable_metrics")
        if isinstance(value, bool):
            return value
        return self.metrics_route


def parse_report(raw: bytes | None) -> ServerReport | None:
    """The host's JSON line (None when the probe did not ask: no server, or no python)."""

    if not raw or not raw.strip():
        return None
    try:
        value: object = json.loads(raw.decode("utf-8", errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ServerReport(route=None, error="the server report is not JSON")
    if not isinstance(value, dict):
        return ServerReport(route=None, error="the server report is not a JSON object")
    report: dict[str, object] = mask_reported(value)  # a JSON object masked is a JSON object
    settings = report.get("settings")
    in_flight = report.get("in_flight")
    metrics_route = report.get("metrics_route")
    return ServerReport(
        route=str(report["route"]) if report.get("route") else None,
        settings=dict(settings) if isinstance(settings, dict) else {},
        version=str(report["version"]) if report.get("version") is not None else None,
        launch_command=str(report["launch_command"]) if report.get("launch_command") is not None else None,
        metrics_route=metrics_route if isinstance(metrics_route, bool) else None,
        in_flight=in_flight if isinstance(in_flight, dict) else None, error=str(report["error"]) if report.get("error") else None,
    )


def report_json(report: ServerReport | None) -> ReportJSON | None:
    """The ``server.reported`` key of the inspect document (docs/inspect-json.md)."""
    if report is None:
        return None
    return {"route": report.route, "version": report.version, "settings": dict(report.settings),
            "launch_command": report.launch_command, "metrics_route": report.metrics_route,
            "in_flight": report.in_flight, "error": report.error}


def report_lines(reported: ReportJSON | None, metrics_enabled: bool | None) -> list[str]:
    """The report's lines about what the server says of itself."""
    lines = []
    if reported is not None:
        if reported["error"]:
            lines.append(f"the server's own report: unavailable ({reported['error']})")
        else:
            settings = reported["settings"]
            said = ", ".join(f"{k}={settings[k]}" for k in HEADLINE if k in settings and k != "enable_metrics")
            lines.append(f"the server reports (via {reported['route']}, version {reported['version']}): {said or 'no settings'}")
            if reported["in_flight"]:
                lines.append(f"requests in flight: {reported['in_flight']['total']} (from {reported['in_flight']['source']})")
    if metrics_enabled is not None:
        lines.append("metrics: " + ("on (/metrics)" if metrics_enabled else "off (launch with --enable-metrics for /metrics)"))
    return lines
