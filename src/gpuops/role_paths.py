"""Where roles and shared templates are looked up: ``$GPUOPS_ROLES_PATH``, ./roles, then the ones
this gpuops carries (inside the installed package, or the checkout's for an editable install). Kept
apart from ``plan/roles.py`` (which loads and checks roles, and so imports every module's argument
spec), below the memo layer, because the no-op memo's ``memo.code_digest`` needs only these
directories."""

from __future__ import annotations

import os
from pathlib import Path


def default_roles_path() -> list[Path]:
    """``$GPUOPS_ROLES_PATH`` (colon list), ``./roles``, then the roles that ship with gpuops."""
    paths = [Path(p) for p in os.environ.get("GPUOPS_ROLES_PATH", "").split(os.pathsep) if p]
    paths.append(Path.cwd() / "roles")
    paths.append(installed_data_dir() / "roles")
    return paths


def project_root() -> Path:
    # src/gpuops/role_paths.py -> the checkout (roles/ and templates/ live at its top)
    return Path(__file__).resolve().parents[2]


def installed_data_dir() -> Path:
    """The folder holding the ``roles/``, ``templates/`` and ``docs/`` this gpuops ships with.

    An installed package (a wheel: venv, ``--user``, pipx) carries them as ``gpuops/data/``
    (pyproject maps the checkout's top-level folders there), found through the package itself, so
    wherever the install scheme put it. An editable install has no ``gpuops/data``: the checkout.
    The package's folder is this module's (what importlib.resources.files("gpuops") names for a
    package on disk, without importing importlib.resources, tempfile, shutil and random: ~5 ms of
    CPU in every command that reads no host)."""
    packaged = Path(__file__).parent / "data"
    return packaged if packaged.is_dir() else project_root()


def shared_templates_dirs() -> list[Path]:
    return [Path.cwd() / "templates", installed_data_dir() / "templates"]
