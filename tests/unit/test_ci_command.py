"""README's test command is the one CI runs (`.ci/run`'s last line) and the one docs/development.md
gives: a change to one of the three (workers, --dist, --durations) that misses another fails here."""

from __future__ import annotations

import re

from labtools import REPO_ROOT

PYTEST = re.compile(r"^(?:exec )?(\.venv/bin/python -m pytest [^\n]*)$", re.M)


def commands_in(relative: str) -> list[str]:
    return PYTEST.findall((REPO_ROOT / relative).read_text())


def test_readme_docs_and_ci_run_the_same_test_command() -> None:
    ci = commands_in(".ci/run")
    assert len(ci) == 1, ci
    assert commands_in("README.md") == ci
    assert commands_in("docs/development.md")[:1] == ci
    # in parallel workers, each test file whole in one (its module-scoped labs started once), and
    # the slowest 20 printed
    assert " -n " in ci[0] and "--dist loadfile" in ci[0] and "--durations=20" in ci[0]
