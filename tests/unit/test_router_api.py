"""Which worker API a router speaks, told from the router's own answers (apply/router_api.py).

The answers are the real releases' (tests/fixtures/recorded/sglang-router/<version>.json, recorded
from sglang-router 0.2.0, 0.2.4 and 0.3.2 running in front of lab stand-ins), replayed by a real
HTTP server on loopback; the roll itself against the real 0.2.4 and 0.3.2 routers is in
tests/integration/test_replica_roll.py.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from gpuops.apply.router_api import Router, RouterError, WorkerApi
from gpuops.lab.ports import free_ports

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "sglang-router"


def _recorded(version: str) -> dict[str, list[Any]]:
    return dict(json.loads((RECORDED / f"{version}.json").read_text())["routes"])


class Replay:
    """A loopback router answering from a route table ("METHOD /path" -> [status, body]); every
    request it got, in order. Removals and additions answer 202 as both releases do."""

    def __init__(self, routes: dict[str, list[Any]]) -> None:
        self.routes = routes
        self.seen: list[str] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                key = f"{self.command} {self.path}"
                replay.seen.append(key)
                status, body = replay.routes.get(key) or (
                    [202, {"status": "accepted"}] if self.command in ("DELETE", "POST") else [404, None])
                raw = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        (port,) = free_ports(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replay() -> Iterator[Any]:
    made: list[Replay] = []

    def start(routes: dict[str, list[Any]]) -> Replay:
        made.append(Replay(routes))
        return made[-1]

    yield start
    for one in made:
        one.close()


@pytest.mark.parametrize("version, api", [("0.2.0", WorkerApi.BY_URL), ("0.2.4", WorkerApi.BY_URL),
                                          ("0.3.2", WorkerApi.BY_ID)])
def test_each_release_is_told_from_its_answers_and_taken_out_by_its_own_key(replay: Any, version: str,
                                                                              api: WorkerApi) -> None:
    routes = _recorded(version)
    router = replay(routes)
    detected, workers = Router(router.url).detect()
    assert detected.api is api
    first = routes["GET /workers"][1]["workers"][0]
    key = first["id"] if api is WorkerApi.BY_ID else first["url"]
    path = "/workers/" + key.replace(":", "%3A").replace("/", "%2F")
    # The key was confirmed by the router answering that worker, before anything was asked of it.
    assert router.seen == ["GET /workers", f"GET {path}"]
    detected.remove(workers[0])
    assert router.seen[-1] == f"DELETE {path}"
    detected.add(first["url"])
    assert router.seen[-1] == "POST /workers"


def test_a_worker_named_by_a_key_the_router_does_not_answer_is_refused(replay: Any) -> None:
    """0.3.2's listing with each id replaced by the URL (as a 0.2 router lists them): 0.3.2 answers
    GET /workers/{url} with 400 "expected UUID", so the key is wrong and nothing is taken out."""
    routes = _recorded("0.3.2")
    for worker in routes["GET /workers"][1]["workers"]:
        worker["id"] = worker["url"]
    router = replay(routes)
    with pytest.raises(RouterError) as caught:
        Router(router.url).detect()
    message = str(caught.value)
    assert message.startswith(f"router {router.url}: its worker API is not one gpuops knows (GET /workers/http%3A")
    assert "expected UUID" in message and message.endswith("nothing changed")
    assert "\n" not in message and caught.value.exit_status == 2
    assert not [s for s in router.seen if not s.startswith("GET ")]  # nothing removed


def test_a_router_with_only_the_legacy_routes_is_refused_naming_them(replay: Any) -> None:
    """sglang-router before 0.2 serves /list_workers (0.2.0's own answer here) but no /workers."""
    legacy = {"GET /list_workers": _recorded("0.2.0")["GET /list_workers"]}
    router = replay(legacy)
    with pytest.raises(RouterError) as caught:
        Router(router.url).detect()
    assert "offers only the legacy /list_workers, /add_worker and /remove_worker" in str(caught.value)
    assert "upgrade the router to 0.2 or later" in str(caught.value)
    assert router.seen == ["GET /workers", "GET /list_workers"]


@pytest.mark.parametrize("routes, why", [
    ({}, "(GET /workers answered HTTP 404)"),
    ({"GET /workers": [200, {"urls": ["http://127.0.0.1:1"]}]}, "(GET /workers answered no worker list)"),
    ({"GET /workers": [200, {"workers": [{"id": "a", "url": "http://127.0.0.1:1"},
                                         {"id": "http://127.0.0.1:2", "url": "http://127.0.0.1:2"}]}]},
     "some workers are listed by their URL, others by an id"),
])
def test_an_unknown_api_is_one_line_naming_the_router(replay: Any, routes: dict[str, list[Any]], why: str) -> None:
    router = replay(routes)
    with pytest.raises(RouterError) as caught:
        Router(router.url).detect()
    assert str(caught.value).startswith(f"router {router.url}: its worker API is not one gpuops knows")
    assert why in str(caught.value)


def test_a_router_down_or_refusing_is_said_as_it_is_not_as_an_unknown_api(replay: Any) -> None:
    (port,) = free_ports(1)
    with pytest.raises(RouterError, match=r"cannot reach it \(GET /workers"):
        Router(f"http://127.0.0.1:{port}").detect()
    router = replay({"GET /workers": [401, {"error": "unauthorized"}]})
    with pytest.raises(RouterError) as caught:
        Router(router.url).detect()
    assert "answered HTTP 401" in str(caught.value) and "not one gpuops knows" not in str(caught.value)


def test_an_empty_router_is_told_nothing_and_takes_nothing_out(replay: Any) -> None:
    router = replay({"GET /workers": [200, {"workers": [], "total": 0}]})
    detected, workers = Router(router.url).detect()
    assert detected.api is None and workers == []
