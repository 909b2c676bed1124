"""Where roles and shared templates are looked up: ``$GPUOPS_ROLES_PATH``, ./roles, the checkout,
the installed data files. Kept apart from ``roles.py`` (which loads and checks roles, and so
imports every module's argument spec) because the no-op memo's ``memo.code_digest`` needs
only these directories."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def default_roles_path() -> list[Path]:
    """``$GPUOPS_ROLES_PATH`` (colon list), ``./roles``, then the roles that ship with gpuops."""
    paths = [Path(p) for p in os.environ.get("GPUOPS_ROLES_PATH", "").split(os.pathsep) if p]
    paths.append(Path.cwd() / "roles")
    paths.append(project_root() / "roles")
    paths.append(installed_data_dir() / "roles")
    return paths


def project_root() -> Path:
    # src/gpuops/plan/role_paths.py -> the checkout (roles/ and templates/ live at its top)
    return Path(__file__).resolve().parents[3]


def installed_data_dir() -> Path:
    # A wheel (non-editable install) puts roles/ and templates/ here (pyproject's data-files).
    return Path(sys.prefix) / "share" / "gpuops"


def shared_templates_dirs() -> list[Path]:
    return [Path.cwd() / "templates", project_root() / "templates", installed_data_dir() / "templates"]
