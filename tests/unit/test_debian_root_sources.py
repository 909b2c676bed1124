"""Which mirror and suite the lab's debootstrap uses: read from apt's own sources, both formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.errors import GpuopsError
from gpuops.lab.debian_root import AptSource, apt_sources, main_source


def test_deb822_and_one_line_sources_pick_the_release_archive(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("# nothing here\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm-updates bookworm\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\nTypes: deb-src\nURIs: http://src.example/\nSuites: bookworm\n"
    )
    (tmp_path / "sources.list.d" / "off.sources").write_text(
        "Enabled: no\nTypes: deb\nURIs: http://disabled.example/\nSuites: trixie\n")
    (tmp_path / "sources.list.d" / "other.list").write_text(
        "deb [arch=amd64 signed-by=/k.gpg] http://other.example/apt stable main\n")
    (tmp_path / "sources.list.d" / "x.list.disabled-by-someone").write_text("deb http://never.example/ sid main\n")
    found = apt_sources(tmp_path)
    assert found == [AptSource("http://mirror.example/debian", "bookworm-updates"),
                     AptSource("http://mirror.example/debian", "bookworm"),
                     AptSource("http://mirror.example/debian-security", "bookworm-security"),
                     AptSource("http://other.example/apt", "stable")]
    assert main_source(found) == AptSource("http://mirror.example/debian", "bookworm")


def test_no_archive_is_one_clear_error() -> None:
    with pytest.raises(GpuopsError, match="no Debian archive"):
        main_source([AptSource("http://mirror.example/debian-security", "bookworm-security")])
