"""The JSON the host-side helper gets: the plan as bytes and hashes, plus how to verify it."""

from __future__ import annotations

import base64
import getpass
import socket
from typing import Any

from gpuops.plan.model import Plan
from gpuops.remote.host_protocol import MODE_APPLY
from gpuops.plan.image_patch import path_in_image


def run_meta(plan: Plan, vars_sha256: str) -> dict[str, Any]:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers): still journal something useful
        user = "unknown"
    return {"role": plan.role, "user": user, "client": socket.gethostname(), "vars_sha256": vars_sha256}


def apply_payload(plan: Plan, run_id: str, vars_sha256: str, audit_sh: str | None) -> dict[str, Any]:
    return {
        "mode": MODE_APPLY,
        "run_id": run_id,
        "state_dir": plan.state_dir,
        "meta": run_meta(plan, vars_sha256),
        "changes": [
            {
                "path": change.path,
                "after_b64": base64.b64encode(change.after.encode("utf-8")).decode(),
                "before_sha256": change.before_sha256,
                "after_sha256": change.after_sha256,
                "mode": change.mode,
                **({"delete": True} if change.action == "delete" else {}),
            }
            for change in plan.changes
            if change.kind != "image"  # files of a derived image: built from "image" below, not written here
        ],
        "compile": [{"python": c.python, "paths": list(c.paths)} for c in plan.compile_checks],
        "handlers": [{"name": h.name, "daemon_reload": h.daemon_reload} for h in plan.handlers],
        "service": plan.service.to_json() if plan.service else None,
        "audit": {"sh": audit_sh} if (plan.audit and audit_sh) else None,
        "read_log": plan.log_check is not None,   # the server's log comes back with "verified"
        "image": image_build(plan),
    }


def image_build(plan: Plan) -> dict[str, Any] | None:
    """docker: the derived image the helper builds (remote/container_image.py) before the restart."""
    if plan.image is None:
        return None

    files = [{"path": path_in_image(plan.image.tag, c.path), "before_sha256": c.before_sha256,
              "after_b64": base64.b64encode(c.after.encode("utf-8")).decode()}
             for c in plan.changes if c.kind == "image"]
    return {**plan.image.to_json(), "files": files}
