"""The server as each release speaks: routes and ``/server_info`` fields read from the real releases'
source (0.5.8, 0.5.16, 0.5.23 wheels, cached; the route choice for every release 0.5.7-0.5.23), the
stand-in answering exactly those, and the one server client asking each the way it answers
(``remote/sglang_server.py``)."""

from __future__ import annotations

import json
import re
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuops.lab.sglang_cache import sglang_site
from gpuops.lab.standin_process import start_standin
from gpuops.remote import sglang_release
from gpuops.facts.server_report import HEADLINE
from gpuops.remote import sglang_server
from gpuops.remote.sglang_server import ServerClient, ServerError, find_server_pid

pytestmark = pytest.mark.integration

RELEASES = ("0.5.8", "0.5.16", "0.5.23")
# Every release the issue names (0.5.7-0.5.23), each only its sglang wheel (cached, shared with the
# other tests of the release cache).
EVERY_RELEASE = tuple(f"0.5.{n}" for n in range(7, 24))
API_KEY = "sk-release-check-4d2b1e"


def root(version: str) -> str:
    return str(sglang_site(version) / "sglang")


@pytest.mark.parametrize("version", RELEASES)
def test_routes_are_read_from_the_release_source(version: str) -> None:
    routes = sglang_release.release_routes(root(version))
    gets = sglang_release.route_paths(routes, "GET")
    posts = sglang_release.route_paths(routes, "POST")
    # Every release 0.5.8-0.5.23 has both spellings; the old one says it is deprecated.
    assert {"/health", "/server_info", "/get_server_info", "/model_info", "/get_model_info"} <= gets
    assert {"/generate", "/v1/completions", "/v1/chat/completions"} <= posts
    deprecated = {r.path for r in routes if r.deprecated}
    assert {"/get_server_info", "/get_model_info"} <= deprecated and "/server_info" not in deprecated
    # /v1/loads comes from the router http_server.py includes (v1_loads.py), not from the file itself
    loads = [r for r in routes if r.path == "/v1/loads"]
    assert loads and loads[0].file == "sglang/srt/entrypoints/v1_loads.py"
    # /metrics is mounted only with --enable-metrics
    assert [r.needs for r in routes if r.path == "/metrics"] == ["enable_metrics"]
    assert ("/get_load" in gets) == (version != "0.5.23")  # 0.5.23 dropped the /get_load alias


def _served(text: str, owner: str, path: str) -> bool:
    """Whether ``text`` registers GET ``path`` on ``owner``: a plain reading of FastAPI's decorator,
    independent of ``sglang_release``'s AST walk."""
    return re.search(rf'@{owner}\.(get|api_route)\(\s*"{re.escape(path)}"', text) is not None


def _release_python(tmp_path: Path, version: str) -> str:
    """A python that imports that release, as a host's server python does (found, not imported)."""
    python = tmp_path / f"python-{version}"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={sglang_site(version)} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python)


@pytest.mark.parametrize("version", EVERY_RELEASE)
def test_the_client_asks_every_release_its_own_routes(tmp_path: Path, version: str) -> None:
    """Each release 0.5.7-0.5.23: the routes the client asks (found from the release's python, as
    ``ServerClient.for_process`` does on a host) are the ones its ``http_server.py`` registers, the
    current spelling first and no route it lacks, so no question relies on a 404 to move on."""
    sglang = Path(root(version))
    text = (sglang / "srt" / "entrypoints" / "http_server.py").read_text()
    loads_file = sglang / "srt" / "entrypoints" / "v1_loads.py"
    loads = ("v1_loads import router" in text and loads_file.is_file()
             and _served(loads_file.read_text(), "router", "/v1/loads"))
    expected = {
        "server_info": [p for p in ("/server_info", "/get_server_info") if _served(text, "app", p)],
        "model_info": [p for p in ("/model_info", "/get_model_info") if _served(text, "app", p)],
        "load": (["/v1/loads"] if loads else []) + (["/get_load"] if _served(text, "app", "/get_load") else []),
    }
    routes = sglang_server.installed_get_routes(_release_python(tmp_path, version))
    assert routes is not None, f"{version}: the release's routes were not read"
    client = ServerClient("http://127.0.0.1:9", routes=routes)
    asked = {"server_info": client.ordered(sglang_server.SERVER_INFO_ROUTES),
             "model_info": client.ordered(sglang_server.MODEL_INFO_ROUTES),
             "load": client.ordered(sglang_server.LOAD_ROUTES)}
    assert asked == expected, version
    assert all(asked.values()), f"{version}: a question no route of the release answers"
    # the health wait's route, served by every release
    assert sglang_server.HEALTH_ROUTE in routes and _served(text, "app", sglang_server.HEALTH_ROUTE)
    # /metrics exists with --enable-metrics wherever the release mounts its Prometheus app
    assert ("/metrics" in routes) == ("add_prometheus_middleware(" in text)
    # /server_info's fields: the settings in_effect and the report read, where the release has them
    fields = sglang_release.server_arg_fields(str(sglang))
    args_text = "".join(f.read_text() for f in [sglang / "srt" / "server_args.py",
                                                 *(sglang / "srt" / "arg_groups").glob("**/*.py")])
    for name in HEADLINE:
        assert (name in fields) == (re.search(rf"^[ \t]+{name}[ \t]*:", args_text, re.M) is not None), (version, name)
    assert {"api_key", "tp_size", "speculative_algorithm", "enable_metrics"} <= set(fields)
    # launch_command: reported by the releases whose /server_info builder sets it
    builder = text + ((sglang / "srt" / "utils" / "common.py").read_text()
                      if (sglang / "srt" / "utils" / "common.py").is_file() else "")
    sets_it = re.search(r'"launch_command":\s*server_args\.launch_command|result\["launch_command"\]', builder)
    assert sglang_release.reports_launch_command(str(sglang)) == (sets_it is not None), version


@pytest.mark.parametrize("version", RELEASES)
def test_server_info_fields_are_the_release_server_args(version: str) -> None:
    fields = sglang_release.server_arg_fields(root(version))
    for name in ("api_key", "attention_backend", "enable_flashinfer_allreduce_fusion", "disable_custom_all_reduce",
                 "speculative_algorithm", "speculative_num_steps", "enable_metrics", "tp_size"):
        assert name in fields, name
    assert fields["enable_metrics"] is False and fields["api_key"] is None
    # launch_command: only 0.5.23's build_server_info reports it
    assert sglang_release.reports_launch_command(root(version)) == (version == "0.5.23")
    names = sglang_release.metric_names(root(version))
    assert {"sglang:num_running_reqs", "sglang:cuda_graph_passes_total", "sglang:queue_time_seconds"} <= names
    assert ("sglang:spec_verify_calls_total" in names) == (version != "0.5.8")


def _standin(tmp_path: Path, version: str, flags: tuple[str, ...] = (), **env: str):
    # Every route is asked, /start_profile too: with no output_dir SGLang (and so the stand-in) writes
    # its traces to $SGLANG_TORCH_PROFILER_DIR, else /tmp (20 files a run were left there)
    return start_standin(tmp_path / "logs", flags=("--model-path", "/models/Qwen3-32B", "--tp", "4", *flags),
                         env={"PYTHONPATH": str(sglang_site(version)), "GPUOPS_STANDIN_TOKENS_PER_S": "2000",
                              "SGLANG_TORCH_PROFILER_DIR": str(tmp_path / "profiles"), **env})


def _status(url: str, method: str = "GET", key: str | None = None) -> int:
    data = b"{}" if method in ("POST", "PUT") else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


# The stand-in against the releases that change its surface: 0.5.7 (the oldest the issue names: no
# /v1/loads router), 0.5.8 (/v1/loads), 0.5.16, 0.5.20 (launch_command in /server_info), 0.5.23
# (no /get_load); the client's choice for every release between is test_the_client_asks_every_release_its_own_routes.
@pytest.mark.parametrize("version", ("0.5.7", "0.5.8", "0.5.16", "0.5.20", "0.5.23"))
def test_the_standin_answers_every_route_of_its_release(tmp_path: Path, version: str) -> None:
    routes = sglang_release.release_routes(root(version))
    # A route the release keeps only to refuse answers as it refuses (0.5.16's /weight_version: 404,
    # as the real server answered on the H200); every other route is served.
    refused = sglang_release.refused_routes(root(version))
    with _standin(tmp_path, version, ("--enable-metrics",)) as server:
        missing = []
        for route in routes:
            if "{" in route.path or "WEBSOCKET" in route.methods:
                continue
            for method in route.methods:
                if method not in ("GET", "POST", "PUT", "DELETE"):
                    continue
                status = _status(server.url + route.path, method)
                if status != refused[route.path][0] if route.path in refused else status == 404:
                    missing.append(f"{method} {route.path} ({route.file}:{route.line}): {status}")
        assert not missing, missing
        assert _status(server.url + "/no_such_route") == 404
        info = json.loads(urllib.request.urlopen(server.url + "/server_info", timeout=10).read())
        assert info["version"] == version
        assert set(sglang_release.server_arg_fields(root(version))) <= set(info)
        assert ("launch_command" in info) == (version in ("0.5.20", "0.5.23"))


def test_a_release_without_the_deprecated_aliases_is_still_asked_right(tmp_path: Path) -> None:
    with _standin(tmp_path, "0.5.23", GPUOPS_STANDIN_DROP_DEPRECATED="1") as server:
        assert _status(server.url + "/get_server_info") == 404 and _status(server.url + "/get_model_info") == 404
        for routes in (None, sglang_release.route_paths(sglang_release.release_routes(root("0.5.23")))):
            client = ServerClient(server.url, routes=routes)
            assert client.server_info()["tp_size"] == 4
            assert client.model_info()["model_path"] == "/models/Qwen3-32B"
            assert client.answered == {"server_info": "/server_info", "model_info": "/model_info"}


class _OldServer(BaseHTTPRequestHandler):
    """A server as releases before /server_info answered (only the /get_* spelling): a real HTTP server."""

    def do_GET(self) -> None:
        body = {"/get_server_info": {"tp_size": 2, "version": "0.4.0"}, "/get_model_info": {"model_path": "/m"}}.get(self.path)
        data = json.dumps(body if body is not None else {"detail": "Not Found"}).encode()
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_an_older_release_is_asked_its_own_spelling() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _OldServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = ServerClient(f"http://127.0.0.1:{httpd.server_address[1]}")
        assert client.server_info()["tp_size"] == 2 and client.model_info()["model_path"] == "/m"
        assert client.answered == {"server_info": "/get_server_info", "model_info": "/get_model_info"}
        assert client.metrics() is None and client.in_flight() is None
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_api_key_server_is_asked_with_its_key_which_never_comes_back(tmp_path: Path) -> None:
    with _standin(tmp_path, "0.5.23", ("--api-key", API_KEY, "--enable-metrics")) as server:
        assert _status(server.url + "/server_info") == 401 and _status(server.url + "/health") == 200
        assert _status(server.url + "/metrics") == 200  # health and metrics are open, as in srt/utils/auth.py
        with pytest.raises(ServerError, match="401"):
            ServerClient(server.url).server_info()
        pid = find_server_pid(server.url)
        assert pid == server.process.pid
        client = ServerClient.for_process(server.url, pid)
        info = client.server_info()
        text = json.dumps(info)
        assert API_KEY not in text
        assert info["api_key"].startswith("<masked:") and "--api-key <masked:" in info["launch_command"]
        assert client.model_info()["model_path"] == "/models/Qwen3-32B"


def test_in_flight_counts_the_requests_the_server_holds(tmp_path: Path) -> None:
    with _standin(tmp_path, "0.5.23", ("--enable-metrics",), GPUOPS_STANDIN_TOKENS_PER_S="20") as server:
        client = ServerClient(server.url)
        assert client.in_flight().total == 0
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 40}, "stream": False}).encode()

        def one() -> None:
            request = urllib.request.Request(server.url + "/generate", data=body, headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=30).read()

        threads = [threading.Thread(target=one) for _ in range(3)]
        for thread in threads:
            thread.start()
        import time

        deadline = time.monotonic() + 5
        seen = client.in_flight()
        while seen.total < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = client.in_flight()
        assert seen.total == 3 and seen.source == "/v1/loads", seen.as_record()
        for thread in threads:
            thread.join()
        assert client.in_flight().total == 0
        after = client.metrics()["values"]
        assert after["sglang:num_requests_total"] == 3 and after["sglang:generation_tokens_total"] == 120


@pytest.mark.parametrize("version, serving, decode", [
    ("0.5.8", "sglang.bench_serving", "sglang.bench_one_batch_server"),
    ("0.5.16", "sglang.benchmark.serving", "sglang.benchmark.one_batch_server"),
    ("0.5.23", "sglang.benchmark.serving", "sglang.benchmark.one_batch_server"),
])
def test_tool_sglang_runs_the_benchmark_module_where_the_release_has_it(version: str, serving: str, decode: str) -> None:
    from gpuops.remote.bench_tool import tool_module

    assert tool_module("sglang.bench_serving", root(version)) == serving
    assert tool_module("sglang.bench_one_batch_server", root(version)) == decode
    assert tool_module("sglang.bench_serving", None) == "sglang.bench_serving"


ADMIN_KEY = "sk-admin-frames-9c1e77"
HF_TOKEN = "hf_frames_Z8x7C6v5"


def test_the_frames_the_host_writes_are_masked_on_the_host(tmp_path: Path) -> None:
    """The bench client masks every frame on the host with the secrets policy, before stdout and
    before the host's own frames file: the server's key (which it asks with), a secret flag of its
    command line (``--admin-api-key``, also in 0.5.23's ``launch_command`` and ``admin_api_key``) and
    a secret in its environment. Home masks again (``tests/unit/test_reported_secrets.py``)."""
    import subprocess

    from gpuops.bench.frames import parse_frames
    from gpuops.bench.options import BenchOptions, build_payload
    from gpuops.shipping import python_command, python_stdin

    flags = ("--api-key", API_KEY, "--admin-api-key", ADMIN_KEY)
    with _standin(tmp_path, "0.5.23", flags, SGLANG_HF_TOKEN=HF_TOKEN) as server:
        payload = build_payload(BenchOptions(suite="decode", num_requests=1, warmup=0, input_len=8, output_len=8),
                                "maskedframes", server.url, {})
        frames_file = tmp_path / "host" / "maskedframes.frames"
        payload.update(record_file=str(frames_file), pid_file=str(tmp_path / "bench.pid"),
                       progress_file=str(tmp_path / "bench.progress"))
        done = subprocess.run(["sh", "-c", python_command(sys.executable)], input=python_stdin("bench_client", payload),
                              capture_output=True, timeout=120)
    out = done.stdout.decode()
    assert done.returncode == 0, out[-2000:] + done.stderr.decode()[-2000:]
    kept = frames_file.read_text()
    assert "GPUOPS-BENCH maskedframes server" in kept and "GPUOPS-BENCH maskedframes end" in kept
    for secret in (API_KEY, ADMIN_KEY, HF_TOKEN):
        assert secret not in kept and secret not in out, secret
    server_frame = next(json.loads(line.split(" ", 3)[3]) for line in kept.splitlines() if " server " in line)
    from gpuops.secret_policy import mask

    assert server_frame["process_env"]["SGLANG_HF_TOKEN"] == mask(HF_TOKEN)
    assert server_frame["server_info"]["admin_api_key"] == mask(ADMIN_KEY)
    assert f"--admin-api-key {mask(ADMIN_KEY)}" in server_frame["server_info"]["launch_command"]
    run = parse_frames(out, "maskedframes")
    assert run.finished and len(run.samples) == 1 and run.samples[0]["ok"], run.errors


def _tool_release(tmp_path: Path, version: str) -> str:
    """A python whose ``sglang`` is a slim package holding SGLang's benchmark modules: ``serving`` is
    the release's own ``get_auth_headers`` (read from its ``benchmark/serving.py``) driving requests
    to the server and writing one ``bench_serving``-shaped line; ``one_batch_server`` is the release's
    real file. The real ``bench_serving`` needs transformers and a tokenizer, which no test host
    has; its authentication is exactly that function."""
    import ast

    real = Path(root(version)) / "benchmark"
    source = (real / "serving.py").read_text()
    function = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "get_auth_headers")
    site = tmp_path / f"tool-site-{version}"
    package = site / "sglang" / "benchmark"
    package.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "one_batch_server.py").write_text((real / "one_batch_server.py").read_text())
    (package / "serving.py").write_text("\n".join([
        "import argparse, json, os, time, urllib.request",
        "from typing import Dict",
        ast.get_source_segment(source, function) or "",
        "p = argparse.ArgumentParser()",
        "p.add_argument('--base-url'); p.add_argument('--output-file'); p.add_argument('--max-concurrency', type=int)",
        "p.add_argument('--num-prompts', type=int, default=1); p.add_argument('--random-output-len', type=int, default=8)",
        "args, _ = p.parse_known_args()",
        "start, tokens = time.perf_counter(), 0",
        "for _ in range(args.num_prompts):",
        "    body = {'text': 'hi', 'sampling_params': {'max_new_tokens': args.random_output_len, 'ignore_eos': True}}",
        "    req = urllib.request.Request(args.base_url + '/generate', data=json.dumps(body).encode(),",
        "                                 headers={'Content-Type': 'application/json', **get_auth_headers()})",
        "    tokens += json.loads(urllib.request.urlopen(req, timeout=30).read())['meta_info']['completion_tokens']",
        "took = time.perf_counter() - start",
        "line = {'max_concurrency': args.max_concurrency, 'completed': args.num_prompts, 'duration': took,",
        "        'output_throughput': tokens / took, 'total_output_tokens': tokens}",
        "open(args.output_file, 'a').write(json.dumps(line) + '\\n')",
        "",
    ]))
    python = tmp_path / f"tool-python-{version}"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python)


def test_tool_sglang_benches_a_server_that_wants_its_key(tmp_path: Path) -> None:
    """``--tool sglang`` against a server started with ``--api-key`` (the stand-in enforces it as
    ``srt/utils/auth.py`` does): the tool gets the server's key in ``OPENAI_API_KEY``, the release's
    own ``get_auth_headers`` sends it, and the key is nowhere in what comes back or is stored; the
    decode suite's ``one_batch_server``, which sends no key, is refused up front, saying why."""
    from types import MappingProxyType

    from gpuops.bench.options import BenchOptions
    from gpuops.bench.runner import BenchTarget, run_bench
    from gpuops.bench.store import ResultsStore
    from gpuops.inventory import Host
    from gpuops.transport import ConnectOptions

    python = _tool_release(tmp_path, "0.5.23")
    with _standin(tmp_path, "0.5.23", ("--api-key", API_KEY)) as server:
        assert _status(server.url + "/generate", "POST") == 401
        host = Host(name="keyed", address=None, port=None, user=None, key_file=None, connection="local",
                    groups=("all",), vars=MappingProxyType({"sglang_python": python}))
        store = ResultsStore(tmp_path / "results")
        target = [BenchTarget(host, server.url, sys.executable)]
        serving = run_bench(target, BenchOptions(suite="serving", tool="sglang", concurrency=(1,), output_len=8,
                                                 requests_per_level=2), store, ConnectOptions(), remote=False)["keyed"]
        decode = run_bench(target, BenchOptions(suite="decode", tool="sglang", num_requests=1, output_len=8),
                           store, ConnectOptions(), remote=False)["keyed"]
    assert serving.status == "done" and serving.error is None, serving.error
    level = serving.result["levels"][0]
    assert level["source"] == "sglang.bench_serving" and level["completed"] == 2 and level["output_tokens"] == 16
    assert decode.status == "failed" and "sends no API key" in decode.error and "--tool gpuops" in decode.error
    stored = serving.file.read_text()
    assert API_KEY not in stored and API_KEY not in decode.error and "<masked:" in stored
