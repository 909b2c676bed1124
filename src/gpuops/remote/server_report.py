"""What the running server says about itself, for inspect's server probe (stdlib only, Python 3.8+).

Run by the gather with the server's python (``$GPUOPS_PY``), the source on stdin:
``python - URL PID``. Asks through the one server client (``sglang_server``: the route this
release answers, the server's own ``--api-key``, masked in all it returns) and prints one JSON
line: ``{"route", "settings" (the server's resolved settings: /server_info without its live
state), "version", "launch_command", "metrics_route" (whether ``/metrics`` answers), "in_flight",
"error"}``.
"""

import json
import sys

from gpuops.remote.sglang_server import ServerClient, ServerError

# Keys of /server_info that are not settings: live scheduler state, the release, the command line.
NOT_SETTINGS = ("internal_states", "version", "launch_command", "startup_time", "frontend", "kv_events", "env",
                "server_args", "simulated", "speed_model", "status")
TIMEOUT_S = 3.0


def report(url, pid):
    client = ServerClient.for_process(url, pid, python=sys.executable, timeout=TIMEOUT_S)
    out = {"route": None, "settings": None, "version": None, "launch_command": None, "metrics_route": None,
           "in_flight": None, "error": None}
    try:
        info = client.server_info()
    except ServerError as exc:
        out["error"] = str(exc)
        return out
    if not isinstance(info, dict):
        out["error"] = "the server's report is not a JSON object"
        return out
    out["route"] = client.answered.get("server_info")
    out["settings"] = dict((k, v) for k, v in info.items() if k not in NOT_SETTINGS)
    out["version"] = info.get("version")
    out["launch_command"] = info.get("launch_command")
    try:
        out["metrics_route"] = client.metrics_text() is not None
    except ServerError:
        out["metrics_route"] = None
    try:
        seen = client.in_flight()
        out["in_flight"] = seen.as_record() if seen is not None else None
    except ServerError:
        pass
    return out


def main(argv):
    if len(argv) < 3:
        print(json.dumps({"error": "usage: server_report URL PID"}))
        return 2
    try:
        pid = int(argv[2])
    except ValueError:
        pid = None
    print(json.dumps(report(argv[1], pid)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
