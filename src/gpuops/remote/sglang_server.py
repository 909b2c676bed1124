"""The one client of a running SGLang server's HTTP API, on the host (stdlib only, Python 3.8+).

Health checks (the apply helper), the bench client (snapshot, suites, metrics), inspect's server
probe and the smoke check all ask the server through ``ServerClient``, which asks each release the
way it answers:

  * the server's own report: ``/server_info``, else ``/get_server_info`` (the deprecated alias a
    later release may drop); the model's: ``/model_info``, else ``/get_model_info``; the load:
    ``/v1/loads``, else ``/get_load``. When the release's route list is known (``sglang_release``,
    read from the installed ``http_server.py``), only routes it serves are asked; otherwise each
    is tried in order and a 404 moves on to the next;
  * ``--api-key``: a server started with one answers every route but ``/health*`` and
    ``/metrics`` with 401 unless asked with ``Authorization: Bearer KEY`` (``srt/utils/auth.py``).
    The key is read on the host from the server's own command line (``for_process``), is sent
    only to that server over loopback, and every value this client returns has it replaced by its
    masked form (``<masked:…>``, the secrets policy's), so it never travels home;
  * ``/metrics`` (``--enable-metrics``): Prometheus text, summarised by ``prom_text``.

``in_flight()`` is the number of requests the server holds (running + waiting): what a drain
waits on.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import urllib.parse

from gpuops.remote import prom_text, secret_mask, sglang_argv, sglang_release
from gpuops.remote.service_base import HEALTH_PROBE_TIMEOUT_S  # /health runs a generation: >= 1 s

SERVER_INFO_ROUTES = ("/server_info", "/get_server_info")
MODEL_INFO_ROUTES = ("/model_info", "/get_model_info")
LOAD_ROUTES = ("/v1/loads", "/get_load")
HEALTH_ROUTE = "/health"
METRICS_ROUTE = "/metrics"
_FIND_SGLANG = ("import importlib.util,sys\n"
                "s=importlib.util.find_spec('sglang')\n"
                "print((list(s.submodule_search_locations or [''])[0]) if s else '')\n")


class ServerError(Exception):
    pass


# The key of each server a client was made for on this host (url -> key): the streamed requests
# (``bench_http.stream_request``) send it too. It never leaves the host.
_KEYS = {}  # type: dict[str, str]


def known_key(url):
    return _KEYS.get(url.rstrip("/"))


def known_keys():
    """Every server key a client of this process was made with (what its frames must never carry)."""
    return list(_KEYS.values())


def auth_headers(url):
    key = known_key(url)
    return {"Authorization": "Bearer %s" % key} if key else {}


def split_url(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "") or not parts.hostname:
        raise ServerError("unsupported server URL %r (http://HOST:PORT)" % url)
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def masked(value):
    """The secrets policy's masked form of ``value``."""
    return secret_mask.mask(value)


def hide(value, secrets):
    """``value`` (any JSON value) with every occurrence of each of ``secrets`` masked."""
    secrets = [s for s in secrets if s]
    if not secrets:
        return value
    if isinstance(value, dict):
        return dict((hide(k, secrets), hide(v, secrets)) for k, v in value.items())
    if isinstance(value, list):
        return [hide(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, masked(secret))
    return value


class InFlight(object):
    """How many requests the server holds, and where the figure comes from."""

    __slots__ = ("running", "waiting", "source")

    def __init__(self, running, waiting, source):
        self.running = running
        self.waiting = waiting
        self.source = source  # the route or metric read

    @property
    def total(self):
        return self.running + (self.waiting or 0)

    def as_record(self):
        return {"running": self.running, "waiting": self.waiting, "total": self.total, "source": self.source}


class ServerClient(object):
    def __init__(self, url, api_key=None, routes=None, timeout=10.0):
        self.url = url.rstrip("/")
        self.api_key = api_key or None
        self.routes = routes  # the release's GET paths (a set), or None: not known, try in order
        self.timeout = timeout
        self.answered = {}  # what answered each question: {"server_info": "/server_info", ...}
        if self.api_key:
            _KEYS[self.url] = self.api_key

    @classmethod
    def for_process(cls, url, pid=None, python=None, timeout=10.0, env=None):
        """A client for the server ``pid`` runs: its ``--api-key`` from its command line, the routes
        of the release its python (or ``python``) imports, run in ``env`` where given (the
        server's own ``PYTHONPATH``: without it that python may not see the server's SGLang)."""
        argv = process_cmdline(pid) if pid else None
        words = sglang_argv.launch_args(argv or []) if argv else None
        key = sglang_argv.flag_value(words, "--api-key") if words else None
        if python is None and argv and argv[0].startswith("/"):
            python = argv[0]
        return cls(url, api_key=key if isinstance(key, str) else None,
                   routes=installed_get_routes(python, env), timeout=timeout)

    # ---- requests
    def request(self, method, path, body=None, timeout=None, accept=None):
        """(status, raw bytes, content type) of one request; raises ServerError when nothing answers."""
        host, port, base = split_url(self.url)
        conn = http.client.HTTPConnection(host, port, timeout=timeout or self.timeout)
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if accept:
            headers["Accept"] = accept
        if self.api_key:
            headers["Authorization"] = "Bearer %s" % self.api_key
        try:
            conn.request(method, base + path, body=data, headers=headers)
            reply = conn.getresponse()
            return reply.status, reply.read(), reply.getheader("Content-Type") or ""
        except (OSError, socket.timeout, http.client.HTTPException) as exc:
            raise ServerError("cannot reach the server at %s%s: %s" % (self.url, path, exc))
        finally:
            conn.close()

    def get_json(self, path, body=None, timeout=None):
        status, raw, _ = self.request("POST" if body is not None else "GET", path, body, timeout)
        if status != 200:
            raise ServerError("%s%s answered HTTP %d: %s" % (self.url, path, status, self._hidden(raw[:200])))
        try:
            return self.hide(json.loads(raw.decode("utf-8")) if raw else {})
        except ValueError:
            raise ServerError("%s%s did not answer JSON" % (self.url, path))

    def _hidden(self, raw):
        return self.hide(raw.decode("utf-8", "replace"))

    def hide(self, value):
        """``value`` with this client's key masked: nothing it returns carries the key."""
        return hide(value, [self.api_key] if self.api_key else [])

    def ordered(self, candidates):
        """The routes to ask, best first: those the release serves when its routes are known."""
        if self.routes is None:
            return list(candidates)
        served = [c for c in candidates if c in self.routes]
        return served or list(candidates)

    def first_json(self, kind, candidates, timeout=None):
        """The JSON of the first of ``candidates`` that this release answers (a 404 moves on)."""
        tried = []
        for path in self.ordered(candidates):
            status, raw, _ = self.request("GET", path, timeout=timeout)
            if status in (404, 405):
                tried.append("%s: HTTP %d" % (path, status))
                continue
            if status != 200:
                raise ServerError("%s%s answered HTTP %d: %s" % (self.url, path, status, self._hidden(raw[:200])))
            try:
                value = json.loads(raw.decode("utf-8")) if raw else {}
            except ValueError:
                raise ServerError("%s%s did not answer JSON" % (self.url, path))
            self.answered[kind] = path
            return self.hide(value)
        raise ServerError("%s answers none of %s (%s)" % (self.url, ", ".join(candidates), "; ".join(tried)))

    # ---- questions
    def healthy(self, timeout=HEALTH_PROBE_TIMEOUT_S):
        try:
            status, _, _ = self.request("GET", HEALTH_ROUTE, timeout=timeout)
        except ServerError:
            return False
        return 200 <= status < 300

    def server_info(self, timeout=None):
        return self.first_json("server_info", SERVER_INFO_ROUTES, timeout)

    def model_info(self, timeout=None):
        return self.first_json("model_info", MODEL_INFO_ROUTES, timeout)

    def metrics_text(self, timeout=None):
        """The ``/metrics`` page, or None when the server does not expose it (no --enable-metrics)."""
        status, raw, _ = self.request("GET", METRICS_ROUTE, timeout=timeout)
        if status == 404:
            return None
        if status != 200:
            raise ServerError("%s%s answered HTTP %d" % (self.url, METRICS_ROUTE, status))
        self.answered["metrics"] = METRICS_ROUTE
        return self._hidden(raw)

    def metrics(self, timeout=None):
        """The ``sglang:`` series of ``/metrics`` summarised (``prom_text.summarise``), or None."""
        text = self.metrics_text(timeout)
        return None if text is None else prom_text.summarise(text)

    def in_flight(self, timeout=None):
        """The requests the server holds now (an ``InFlight``), or None when it says nothing.

        From ``/v1/loads`` (``num_running_reqs`` + ``num_waiting_reqs`` summed over DP ranks), else
        ``/get_load`` (``num_reqs``: running and waiting), else ``/metrics``'
        ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``."""
        for path in self.ordered(LOAD_ROUTES):
            try:
                status, raw, _ = self.request("GET", path + ("?include=core" if path == "/v1/loads" else ""),
                                              timeout=timeout)
                value = json.loads(raw.decode("utf-8")) if status == 200 else None
            except (ServerError, ValueError):
                continue
            counted = _loads_count(value, path)
            if counted is not None:
                self.answered["load"] = path
                return counted
        try:
            series = self.metrics(timeout)
        except ServerError:
            series = None
        if series and "sglang:num_running_reqs" in series.get("values", {}):
            values = series["values"]
            return InFlight(int(values["sglang:num_running_reqs"]), int(values.get("sglang:num_queue_reqs") or 0),
                            METRICS_ROUTE)
        return None


def _loads_count(value, path):
    rows = value.get("loads") if isinstance(value, dict) else value
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return None
    try:
        waiting = sum(int(r.get("num_waiting_reqs") or 0) for r in rows)
        if path == "/get_load":  # num_reqs: running + waiting (scheduler_metrics_mixin.get_load)
            return InFlight(sum(int(r.get("num_reqs") or 0) for r in rows) - waiting, waiting, path)
        return InFlight(sum(int(r.get("num_running_reqs") or 0) for r in rows), waiting, path)
    except (TypeError, ValueError):
        return None


def find_server_pid(url):
    """The pid of the process that runs ``sglang.launch_server`` on the URL's port, if visible."""
    try:
        _, port, _ = split_url(url)
    except ServerError:
        return None
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        args = sglang_argv.launch_args(process_cmdline(int(entry)) or [])
        if args is None:
            continue
        # No --port: SGLang's default port. Such a server is another port's unless the URL names
        # that one (taking it for ours read its environment: a CI run recorded the wrong stack).
        if (sglang_argv.flag_value(args, "--port") or str(sglang_argv.DEFAULT_PORT)) == str(port):
            return int(entry)
    return None


def process_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % int(pid), "rb") as handle:
            return [w.decode("utf-8", "replace") for w in handle.read().split(b"\0") if w]
    except (OSError, ValueError):
        return None


def installed_root(python=None, env=None):
    """The ``sglang`` package directory ``python`` (default: this one) imports, found without
    importing it, run in ``env`` (default: this process's environment); None when there is none."""
    if env is None and (python is None or os.path.realpath(python) == os.path.realpath(sys.executable)):
        return sglang_release.find_root()
    try:
        done = subprocess.run([python or sys.executable, "-c", _FIND_SGLANG], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    root = done.stdout.decode("utf-8", "replace").strip() if done.returncode == 0 else ""
    return root or None


def installed_get_routes(python=None, env=None):
    """The GET paths of the installed release (a set), or None when its source cannot be read."""
    root = installed_root(python, env)
    if not root:
        return None
    try:
        return sglang_release.route_paths(sglang_release.release_routes(root), "GET")
    except (OSError, SyntaxError, ValueError):
        return None
