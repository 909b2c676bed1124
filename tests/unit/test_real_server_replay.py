"""gpuops against the real SGLang 0.5.16 server's recorded answers (issue 36, defects 1, 5 and 6).

Replayed from ``tests/fixtures/real/h200-x1/sglang-0.5.16/`` (its README says how they were
recorded): ``/model_info`` and ``/server_info`` answer their recorded bodies, ``/generate`` streams
with the recorded answer's ``meta_info`` and, as 0.5.16 does, dies on a token id outside the
vocabulary (the embedding gather's device-side assert takes the whole server down: the stream ends
and nothing listens on the port any more). The server's python environment is rebuilt from the two
recorded ``pip list``s: the machine's own python3 (``pip-plain.json``) and the server's
``PYTHONPATH=/tmp/site`` on top of it (``pip-server-env.json``), as package metadata.

- defect 1: the bench's token ids stay inside the served model's vocabulary (``config.json`` at the
  model path ``/model_info`` names), a prompt of text where that is not known, and a server that
  dies mid-request is called dead;
- defect 5: the bench's host snapshot records the stack the server imports (its environment's
  PYTHONPATH: the running server's own, else ``sglang_env``), the kernel under its new name;
- defect 6: with no server running, inspect's python sees an install on ``sglang_env``'s PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from gpuops.bench.options import BenchOptions
from gpuops.bench.runner import BenchTarget, HostBench, run_bench
from gpuops.bench.store import ResultsStore
from gpuops.facts import software
from gpuops.facts.python_select import preamble_for_vars
from gpuops.gather import gather
from gpuops.inventory import Host
from gpuops.lab.ports import free_port
from gpuops.remote import bench_http
from gpuops.transport import ConnectOptions
from gpuops.transport.local import LocalConnection
from labtools import fixtures_path

REAL = fixtures_path() / "real" / "h200-x1" / "sglang-0.5.16"
# The model that died in issue 36's first run had 2000 tokens; the recorded one (model.txt) 32000.
SMALL_VOCAB = 2000
# The serving stack a bench result records: sgl-kernel is sglang-kernel from 0.4 (0.5.16 pins it).
STACK = ("sglang", "sgl-kernel", "sglang-kernel", "flashinfer-python", "torch", "nvidia-nccl-cu12",
         "nvidia-nccl-cu13", "triton", "transformers")


def recorded(route: str) -> Any:
    """A recorded HTTP answer's body (``http/<route>.json`` keeps it under ``json``)."""
    return json.loads((REAL / "http" / f"{route}.json").read_text())["json"]


def recorded_pip(name: str) -> dict[str, str]:
    return dict(json.loads((REAL / name).read_text()))


def model_dir(tmp_path: Path, vocab_size: int) -> Path:
    """The served model's directory: its config.json as model.txt describes the recorded model
    (LlamaForCausalLM, bf16, hidden 512, 4 layers), with ``vocab_size``."""
    path = tmp_path / "model"
    path.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
              "num_hidden_layers": 4, "vocab_size": vocab_size, "torch_dtype": "bfloat16"}
    (path / "config.json").write_text(json.dumps(config))
    return path


class ReplayServer:
    """The recorded 0.5.16 server on a loopback port; ``model_path`` in both recorded bodies
    becomes ``model_path`` here (where the test put the model's config, or nowhere)."""

    def __init__(self, model_path: str, vocab_size: int, generate: str = "serve") -> None:
        self.vocab_size = vocab_size
        self.generate = generate  # "serve"; "die": on the first request; "cut": its streams end early
        self.bodies: list[dict[str, Any]] = []
        self.dead = False
        self.answers = {
            "/model_info": dict(recorded("model_info"), model_path=model_path),
            "/server_info": dict(recorded("server_info"), model_path=model_path),
        }
        self.meta = dict(recorded("generate")["meta_info"])
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = replay.answers.get(self.path.split("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/generate":
                    self.send_error(404)
                    return
                replay.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                ids = body.get("input_ids") or []
                if replay.generate == "die" or any(not 0 <= i < replay.vocab_size for i in ids):
                    self.wfile.flush()
                    replay.die()  # the stream has begun when the scheduler dies
                    return
                if replay.generate == "cut":
                    return
                prompt = len(ids) or len(str(body.get("text", "")).split())
                for done in range(1, int(body["sampling_params"]["max_new_tokens"]) + 1):
                    meta = dict(replay.meta, prompt_tokens=prompt, completion_tokens=done, finish_reason=None)
                    self.wfile.write(b"data: " + json.dumps({"text": "x", "meta_info": meta}).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def die(self) -> None:
        """Nothing listens on the port from now on."""
        self.dead = True

        def gone() -> None:
            self.httpd.shutdown()
            self.httpd.server_close()

        threading.Thread(target=gone, daemon=True).start()

    def close(self) -> None:
        if not self.dead:
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def replay() -> Iterator[Any]:
    started: list[ReplayServer] = []

    def start(model_path: str, vocab_size: int, generate: str = "serve") -> ReplayServer:
        server = ReplayServer(model_path, vocab_size, generate)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def _dist_infos(site: Path, versions: Mapping[str, str]) -> None:
    for name, version in versions.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def machine(tmp_path: Path) -> tuple[Path, Path]:
    """The recorded machine as package metadata: (its python3, the server's PYTHONPATH dir).

    The python3's own packages are the serving stack's as ``pip-plain.json`` lists them (a venv
    holds them); ``/tmp/site`` holds every stack package whose version ``pip-server-env.json``
    (the listing with the server's PYTHONPATH) shows differently.
    """
    plain, server_env = recorded_pip("pip-plain.json"), recorded_pip("pip-server-env.json")
    venv = tmp_path / "python3"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    own = next(venv.glob("lib/python3*/site-packages"))
    _dist_infos(own, {n: v for n, v in plain.items() if n in STACK})
    site = tmp_path / "site"
    site.mkdir()
    _dist_infos(site, {n: v for n, v in server_env.items() if n in STACK and plain.get(n) != v})
    return venv / "bin" / "python", site


def server_stack() -> dict[str, str]:
    """The serving stack as the server imports it (the recorded listing of its environment)."""
    return {n: v for n, v in recorded_pip("pip-server-env.json").items() if n in STACK}


def bench(url: str, tmp_path: Path, vars: Mapping[str, Any] | None = None, **options: Any) -> HostBench:
    host = Host(name="gpu0", address=None, port=None, user=None, key_file=None, connection="local",
                groups=("all",), vars=MappingProxyType(dict(vars or {})))
    settings = dict(suite="decode", output_len=8, num_requests=2, warmup=1)
    settings.update(options)
    return run_bench([BenchTarget(host, url, sys.executable)], BenchOptions(**settings),
                     ResultsStore(tmp_path / "results"), ConnectOptions(), remote=False)["gpu0"]


# ---------------------------------------------------------------- defect 1: prompts and a dead server

def test_token_ids_stay_inside_the_served_models_vocabulary(replay: Any, tmp_path: Path) -> None:
    server = replay(str(model_dir(tmp_path, SMALL_VOCAB)), SMALL_VOCAB)
    state = bench(server.url, tmp_path, input_len=256)
    assert state.error is None, state.error
    assert not server.dead
    ids = [i for body in server.bodies for i in body["input_ids"]]
    assert len(ids) == 32 + 2 * 256  # the warm-up's 32, then two prompts of 256
    assert max(ids) < SMALL_VOCAB and min(ids) >= 0
    assert any(f"vocabulary of {SMALL_VOCAB}" in note and "config.json" in note for note in state.result["notes"])


def test_a_vocabulary_not_known_sends_text_the_server_tokenizes(replay: Any, tmp_path: Path) -> None:
    # the recorded model path as the server names it (/tmp/model there) does not exist here
    server = replay(str(tmp_path / "not-here"), SMALL_VOCAB)
    state = bench(server.url, tmp_path)
    assert state.error is None, state.error
    assert server.bodies and all("input_ids" not in b and b["text"] for b in server.bodies)
    assert any("text the server tokenizes" in note for note in state.result["notes"])


def test_a_server_that_dies_mid_request_is_called_dead(replay: Any, tmp_path: Path) -> None:
    server = replay(str(model_dir(tmp_path, SMALL_VOCAB)), SMALL_VOCAB, generate="die")
    state = bench(server.url, tmp_path)
    assert state.status == "failed"
    assert f"the server at {server.url} no longer accepts connections" in state.error
    assert "no token counts" not in state.error


def test_a_stream_cut_by_a_live_server_is_not_called_dead(replay: Any, tmp_path: Path) -> None:
    server = replay(str(model_dir(tmp_path, SMALL_VOCAB)), SMALL_VOCAB, generate="cut")
    path, body = bench_http.build_request("native", "m", 1, 8, 4, vocab_size=SMALL_VOCAB)
    sample = bench_http.stream_request(server.url, "native", path, body, timeout=30)
    assert sample["ok"] is False
    assert sample["error"] == "the stream ended before [DONE]: the server closed it"


# ---------------------------------------------------------------- defect 5: the stack a result records

def test_the_snapshot_records_the_stack_on_sglang_envs_pythonpath(replay: Any, tmp_path: Path) -> None:
    python, site = machine(tmp_path)
    server = replay(str(model_dir(tmp_path, 32000)), 32000)
    state = bench(server.url, tmp_path, {"sglang_python": str(python), "sglang_env": {"PYTHONPATH": str(site)}})
    assert state.error is None, state.error
    packages = state.result["host_facts"]["packages"]
    assert packages == server_stack()
    assert packages["sglang"] == "0.5.16" and packages["sglang-kernel"] == "0.4.5"
    assert packages["transformers"] == "5.12.1"  # not the machine's 5.17.0


def test_the_running_servers_own_pythonpath_wins(replay: Any, tmp_path: Path) -> None:
    python, site = machine(tmp_path)
    server = replay(str(model_dir(tmp_path, 32000)), 32000)
    argv = list(json.loads((REAL / "ps.json").read_text())[0]["argv"])  # python3 -m sglang.launch_server ...
    argv[argv.index("--port") + 1] = str(server.port)
    env = dict(os.environ, PYTHONPATH=str(site))
    # the recorded command line, its python kept asleep: what /proc shows of the server
    proc = subprocess.Popen([str(python), "-c", "import time; time.sleep(120)"] + argv[1:], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        state = bench(server.url, tmp_path, {"sglang_python": str(python),
                                             "sglang_env": {"PYTHONPATH": str(tmp_path / "elsewhere")}})
    finally:
        proc.kill()
        proc.wait()
    assert state.error is None, state.error
    assert state.result["host_facts"]["packages"] == server_stack()


# ---------------------------------------------------------------- defect 6: inspect before a server runs

def test_with_no_server_inspect_sees_an_install_on_sglang_envs_pythonpath(tmp_path: Path) -> None:
    python, site = machine(tmp_path)
    vars = {"sglang_port": free_port(), "sglang_python": str(python), "sglang_env": {"PYTHONPATH": str(site)}}
    host = Host(name="gpu0", address=None, port=None, user=None, key_file=None, connection="local",
                groups=("all",), vars=MappingProxyType(vars))
    values = gather(LocalConnection(host), software.probes(), preamble_for_vars(vars))
    system, packages = software.from_values(values)
    assert packages.known, packages.reason
    found = {name: info.version for name, info in packages.packages.items() if info is not None}
    assert found["sglang"] == "0.5.16" and found["sglang-kernel"] == "0.4.5" and found["flashinfer-python"] == "0.6.14"
    assert system.chosen_python_reason == "host var sglang_python; PYTHONPATH from host var sglang_env"
