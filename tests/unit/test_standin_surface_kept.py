"""The lab's stand-in keeps what it read from a release (``standin_surface.kept_release_reading``):
reading a release costs ~120 ms of CPU a start, and every host of a lab has the same release. What is
kept is the reading itself, and it is used only while every file of the tree is the very one it was
read from; anything else is read again."""

from __future__ import annotations

import marshal
import os
from pathlib import Path

import pytest

from gpuops.lab import standin_surface
from gpuops.lab.sglang_cache import sglang_site

HTTP_SERVER = '''
from fastapi import FastAPI, HTTPException
app = FastAPI()

@app.get("/health")
async def health():
    return {}

@app.get("/model_info")
async def model_info():
    return {"model_path": 1, "is_generation": 2}

@app.get("/weight_version")
async def weight_version():
    raise HTTPException(status_code=404, detail="deprecated")
'''
SERVER_ARGS = '''
from dataclasses import dataclass

@dataclass
class ServerArgs:
    model_path: str = None
    tp_size: int = 1
    sizes: tuple = (1, 2)
'''


def release(tmp_path: Path) -> Path:
    root = tmp_path / "sglang"
    (root / "srt" / "entrypoints").mkdir(parents=True)
    (root / "srt" / "entrypoints" / "http_server.py").write_text(HTTP_SERVER)
    (root / "srt" / "server_args.py").write_text(SERVER_ARGS)
    return root


def replace(path: Path, text: str) -> None:
    """As an apply writes a file: a new file renamed over the old one."""
    (path.parent / (path.name + ".new")).write_text(text)
    os.replace(path.parent / (path.name + ".new"), path)


def test_the_kept_reading_is_the_reading_and_the_next_start_reuses_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root, kept = release(tmp_path), tmp_path / "kept"
    first = standin_surface.kept_release_reading(str(root), str(kept))
    assert first == standin_surface.read_release(str(root))
    assert [r[1] for r in first[0]] == ["/health", "/model_info", "/weight_version"]
    assert first[1] == {"model_path": None, "tp_size": 1, "sizes": (1, 2)}  # a tuple stays a tuple
    assert len(list(kept.iterdir())) == 1

    def never(root: str) -> None:
        raise AssertionError("the release was read again although nothing in it changed")

    monkeypatch.setattr(standin_surface, "read_release", never)
    assert standin_surface.kept_release_reading(str(root), str(kept)) == first


def test_a_replaced_or_added_file_is_read_again(tmp_path: Path) -> None:
    root, kept = release(tmp_path), tmp_path / "kept"
    standin_surface.kept_release_reading(str(root), str(kept))
    http = root / "srt" / "entrypoints" / "http_server.py"
    replace(http, HTTP_SERVER.replace('"/health"', '"/healtz"'))  # the same size: a new file all the same
    assert "/healtz" in [r[1] for r in standin_surface.kept_release_reading(str(root), str(kept))[0]]
    replace(http, HTTP_SERVER + '\n@app.get("/ping")\nasync def ping():\n    return {}\n')
    routes = standin_surface.kept_release_reading(str(root), str(kept))[0]
    assert "/ping" in [r[1] for r in routes]
    # a file the reading may depend on appears (an included router, a collector): read again
    (root / "srt" / "metrics").mkdir()
    (root / "srt" / "metrics" / "collector.py").write_text('Gauge(name="sglang:num_running_reqs")\n')
    assert standin_surface.kept_release_reading(str(root), str(kept))[3] == {"sglang:num_running_reqs"}


def test_a_record_that_does_not_load_is_read_again_and_replaced(tmp_path: Path) -> None:
    root, kept = release(tmp_path), tmp_path / "kept"
    expected = standin_surface.kept_release_reading(str(root), str(kept))
    (record,) = kept.iterdir()
    record.write_bytes(b"\x00not marshal")
    assert standin_surface.kept_release_reading(str(root), str(kept)) == expected
    assert marshal.loads(record.read_bytes())[1] == expected


def test_nowhere_to_keep_it_still_answers(tmp_path: Path) -> None:
    root = release(tmp_path)
    (tmp_path / "a-file").write_text("")
    expected = standin_surface.read_release(str(root))
    assert standin_surface.kept_release_reading(str(root), str(tmp_path / "a-file" / "kept")) == expected
    assert standin_surface.kept_release_reading(str(root), None) == expected


def test_a_real_release_reads_the_same_kept_or_not(tmp_path: Path) -> None:
    root = str(sglang_site("0.5.16") / "sglang")
    expected = standin_surface.read_release(root)
    assert expected is not None and len(expected[0]) > 50
    for _ in range(2):  # read and kept, then from what was kept
        assert standin_surface.kept_release_reading(root, str(tmp_path / "kept")) == expected
