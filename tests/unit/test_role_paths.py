"""Where gpuops finds the roles, templates and docs it ships (src/gpuops/role_paths.py)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from labtools import REPO_ROOT

from gpuops import role_paths


def test_a_checkout_uses_its_own_top_level_folders() -> None:
    assert not (Path(role_paths.__file__).parent / "data").exists()
    assert role_paths.installed_data_dir() == REPO_ROOT
    assert role_paths.default_roles_path()[-1] == REPO_ROOT / "roles"


def test_an_installed_package_uses_the_data_folder_beside_its_modules(tmp_path: Path) -> None:
    # A wheel puts roles/, templates/ and docs/ in gpuops/data/, wherever the install scheme put gpuops.
    package = tmp_path / "site-packages" / "gpuops"
    (package / "data" / "roles").mkdir(parents=True)
    shutil.copy(role_paths.__file__, package / "role_paths.py")
    spec = importlib.util.spec_from_file_location("installed_role_paths", package / "role_paths.py")
    assert spec is not None and spec.loader is not None
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    assert installed.installed_data_dir() == package / "data"
    assert installed.shared_templates_dirs()[-1] == package / "data" / "templates"
