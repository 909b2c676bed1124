"""README is a front door and the user guide lives in docs/ (issue 40): README stays short, its test
command is CI's, every page of the guide is reachable from README and its links resolve, and every
command's ``--help`` names a page of the guide that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from labtools import REPO_ROOT

from gpuops.cli import COMMANDS, cli

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
FRONT_DOOR_LIMIT = 15_000  # bytes (issue 40): a front door, not the manual it was (93.7 KB)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _fenced_commands(text: str) -> list[str]:
    return [line.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in block.splitlines()
            if line.strip()]


def test_readme_is_a_front_door() -> None:
    assert len(README.read_bytes()) <= FRONT_DOOR_LIMIT, "README.md grew past 15 KB: move the detail into docs/"


def test_readmes_test_command_is_what_ci_runs() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    ci_command = next(line.removeprefix("exec ").strip() for line in reversed(ci.splitlines())
                      if line.startswith("exec ") and "pytest" in line)
    assert ci_command in _fenced_commands(README.read_text())
    assert "./demo" in _fenced_commands(README.read_text())


def test_every_guide_page_is_linked_from_readme() -> None:
    linked = {(README.parent / target).resolve() for target in LINK.findall(README.read_text())}
    orphans = sorted(page.name for page in DOCS.glob("*.md") if page.resolve() not in linked)
    assert orphans == [], f"docs pages README does not link: {orphans}"


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = [target for target in LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert broken == [], f"{page.relative_to(REPO_ROOT)} links to missing files: {broken}"


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_help_names_an_existing_guide_page(name: str) -> None:
    result = CliRunner().invoke(cli, [*([name] if name else []), "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())  # click wraps the epilog
    assert "User guide:" in help_text, f"gpuops {name} --help names no page of the guide"
    for target in re.findall(r"docs/[\w.-]+\.md", help_text):
        assert (REPO_ROOT / target).is_file(), f"gpuops {name} --help names {target}, which does not exist"
