"""The package probe reports what the server's python finds, not what happens to lie in the
directory the probe runs in (`python -c` puts it first on sys.path; over SSH it is the login
directory, which the server never sees and the kept GPU facts' fingerprint does not cover)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpuops.facts.software import remote_source


def test_a_package_in_the_probes_working_directory_is_not_reported(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (tmp_path / "torch" / "version.py").write_text("__version__ = '9.9.9'\ncuda = '99.9'\n")
    done = subprocess.run([sys.executable, "-c", remote_source()], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.strip().splitlines()[-1])
    torch = data["packages"]["torch"]
    assert torch is None or not str(torch.get("path") or "").startswith(str(tmp_path)), torch
    assert "" not in data["python"]["path"] and str(tmp_path) not in data["python"]["path"]
