"""An sglang-router's worker API, as the router itself shows it: list, take out, put back.

Two releases' APIs are known, read from the releases themselves (the route table in each wheel's
``sglang_router_rs`` library, and the answers of the running router, ``tests/unit/test_router_api.py``
replays them):

- sglang-router 0.3 (0.3.0-0.3.2): ``GET /workers`` lists ``{"workers": [{"id", "url", "is_healthy",
  "load", ...}]}``; one worker is ``/workers/{worker_id}``, a UUID (anything else answers 400,
  "expected UUID"); ``DELETE /workers/{worker_id}`` queues its removal (202), ``POST /workers
  {"url": ...}`` queues its addition.
- sglang-router 0.2 (0.2.0-0.2.4): the same listing and ``POST /workers``, but one worker is
  ``/workers/{url}``, the worker's URL itself (percent-encoded); the listing's ``id`` is that URL.
  0.2.0 and 0.2.1 also serve the legacy ``/list_workers``, ``/add_worker?url=``,
  ``/remove_worker?url=``; gpuops does not need them.

Which one a router speaks is probed, never assumed (``Router.detect``): its listing's ids are UUIDs
or URLs, and ``GET /workers/{key}`` must answer that worker. A router that lists no workers through
``GET /workers`` (sglang-router before 0.2 offers only the legacy routes), or does not answer its
worker by the key its listing gives, is refused with one line before any host is touched.
"""

from __future__ import annotations

import enum
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from typing import Any

from gpuops.errors import GpuopsError
from gpuops.transport.limits import HTTP_REPLY_LIMIT, over_message
from gpuops.frozen import frozen

_REQUEST_TIMEOUT_S = 10.0
KNOWN = "sglang-router 0.2's or 0.3's /workers API"


class RouterError(GpuopsError):
    """The router cannot be asked, or refused: names the router and what failed (``status``: the
    HTTP status it answered, if it answered one)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RouterUnreachable(RouterError):
    """No answer at all: the router is down or not reachable from here (not a refusal)."""


class WorkerApi(enum.Enum):
    """How the router names one worker in its worker API."""

    BY_ID = "sglang-router 0.3 (/workers/{worker_id})"
    BY_URL = "sglang-router 0.2 (/workers/{url})"


def normal_url(url: str) -> str:
    """``url`` as compared with the router's worker URLs: scheme and host lower-case, the port
    written out, no trailing slash."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s)://HOST:PORT URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{port}{parts.path.rstrip('/')}"


def comparable(url: str) -> str:
    try:
        return normal_url(url)
    except ValueError:
        return url


@frozen
class Worker:
    """One worker as the router's ``GET /workers`` lists it: id (a UUID; its URL on 0.2), URL, health, load."""

    id: str
    url: str
    healthy: bool
    load: int | None


def parse_workers(body: Any) -> list[Worker] | None:
    """The workers of a ``GET /workers`` answer; None when it is no worker listing."""
    if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        return None
    out = []
    for entry in body["workers"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            return None
        ident = entry.get("id")
        load = entry.get("load")
        out.append(Worker(id=str(ident) if ident not in (None, "") else entry["url"], url=entry["url"],
                          healthy=entry.get("is_healthy") is True,
                          load=load if isinstance(load, int) and not isinstance(load, bool) else None))
    return out


def api_of(workers: list[Worker]) -> WorkerApi | None:
    """The API a listing shows: 0.3 names each worker by an id of its own, 0.2 by its URL. None
    when the listing is empty (nothing to tell it by; nothing to take out either)."""
    if not workers:
        return None
    if all(w.id == w.url for w in workers):
        return WorkerApi.BY_URL
    if all(w.id != w.url for w in workers):
        return WorkerApi.BY_ID
    raise ValueError("some workers are listed by their URL, others by an id")


@frozen
class Router:
    """An sglang-router at ``url``, with its API key and the worker API it speaks (set by ``detect``)."""

    url: str
    api_key: str | None = None
    api: WorkerApi | None = None  # set by detect()

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url.rstrip("/") + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT_S) as reply:
                raw = reply.read(HTTP_REPLY_LIMIT + 1)  # a router's answer is small: never read without end
                status = reply.status
            if len(raw) > HTTP_REPLY_LIMIT:
                raise RouterError(f"router {self.url}: {method} {path} answered {over_message(HTTP_REPLY_LIMIT)}")
        except urllib.error.HTTPError as exc:
            detail = exc.read(200).decode("utf-8", "replace").strip()
            raise RouterError(f"router {self.url}: {method} {path} answered HTTP {exc.code}"
                              + (f": {detail}" if detail else ""), status=exc.code) from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RouterUnreachable(f"router {self.url}: cannot reach it ({method} {path}: {reason})") from None
        try:
            return status, json.loads(raw.decode("utf-8")) if raw else None
        except ValueError:
            raise RouterError(f"router {self.url}: {method} {path} did not answer JSON") from None

    def _unknown(self, why: str) -> RouterError:
        return RouterError(f"router {self.url}: its worker API is not one gpuops knows ({why}); gpuops takes "
                           f"replicas out through {KNOWN}; nothing changed")

    def detect(self) -> tuple["Router", list[Worker]]:
        """This router with the API it speaks, and its workers: refused (one line) when it speaks none
        gpuops knows."""
        try:
            _, body = self._call("GET", "/workers")
        except RouterError as exc:
            if exc.status not in (404, 405):
                raise  # down, or refused (a wrong api key): said as it is
            raise self._unknown(self._legacy_or_not()) from None
        workers = parse_workers(body)
        if workers is None:
            raise self._unknown("GET /workers answered no worker list")
        try:
            api = api_of(workers)
        except ValueError as exc:
            raise self._unknown(f"GET /workers: {exc}") from None
        if api is not None:
            self._confirm(workers[0], api)
        return replace(self, api=api), workers

    def _legacy_or_not(self) -> str:
        try:
            _, body = self._call("GET", "/list_workers")
        except RouterError:
            return "GET /workers answered HTTP 404"
        if isinstance(body, dict) and isinstance(body.get("urls"), list):
            return ("it offers only the legacy /list_workers, /add_worker and /remove_worker of sglang-router "
                    "before 0.2, which tell no worker's health: upgrade the router to 0.2 or later")
        return "GET /workers answered HTTP 404"

    def _confirm(self, worker: Worker, api: WorkerApi) -> None:
        """The router answers ``GET /workers/{key}`` with the worker the key names: the key is right."""
        path = self._path(worker, api)
        try:
            _, body = self._call("GET", path)
        except RouterError as exc:
            raise self._unknown(str(exc).removeprefix(f"router {self.url}: ")) from None
        if not isinstance(body, dict) or comparable(str(body.get("url", ""))) != comparable(worker.url):
            raise self._unknown(f"GET {path} did not answer worker {worker.url}")

    @staticmethod
    def _path(worker: Worker, api: WorkerApi) -> str:
        key = worker.id if api is WorkerApi.BY_ID else worker.url
        return "/workers/" + urllib.parse.quote(key, safe="")

    def workers(self) -> list[Worker]:
        _, body = self._call("GET", "/workers")
        workers = parse_workers(body)
        if workers is None:
            raise RouterError(f"router {self.url}: GET /workers answered no worker list")
        return workers

    def find(self, worker_url: str) -> Worker | None:
        wanted = normal_url(worker_url)
        for worker in self.workers():
            if comparable(worker.url) == wanted:  # a gRPC worker's URL never compares equal to ours
                return worker
        return None

    def remove(self, worker: Worker) -> None:
        if self.api is None:  # preflight detects it on a listing that holds the replica
            raise RouterError(f"router {self.url}: its worker API was not told before a removal")
        self._call("DELETE", self._path(worker, self.api))

    def add(self, worker_url: str) -> None:
        self._call("POST", "/workers", {"url": worker_url})
