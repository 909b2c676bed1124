"""A bounded load generator: a fixed number of streaming requests through a URL, every one counted.

    load = StreamingLoad("http://127.0.0.1:PORT", clients=4, requests_per_client=50)
    load.start(); ...; result = load.join()
    result.total == 200; result.failed == 0, else result.failures says which and why

``requests_per_client`` bounds each client. To load something only while it happens (a roll),
``load.stop()`` once it is over: each client finishes the request it is streaming and starts no
other; ``result.clients_cut_short == clients`` then says every client was still sending when it
was stopped (none ran out of requests first), so the load covered all of it without streaming on
for nothing afterwards.

A request counts as good only when it answered 200 and streamed to SGLang's ``data: [DONE]`` with a
finished last chunk (``meta_info.finish_reason``) and no error chunk; anything else (a refused
connection, an HTTP error, a stream cut short: ``IncompleteRead``, a reset) is a failure, with its
reason. Imported as ``loadgen`` (tests/conftest.py puts this directory on ``sys.path``).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    total: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    by_worker_seen: Counter = field(default_factory=Counter)
    clients_cut_short: int = 0  # clients that still had requests to send when stop() came

    @property
    def failed(self) -> int:
        return len(self.failures)

    def summary(self) -> str:
        reasons = Counter(f.split(":", 1)[0] for f in self.failures)
        return f"{self.failed} of {self.total} requests failed" + (f" ({dict(reasons)})" if reasons else "")


class StreamingLoad:
    def __init__(self, url: str, clients: int = 4, requests_per_client: int = 50, max_new_tokens: int = 32,
                 timeout_s: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.clients, self.per_client = clients, requests_per_client
        self.max_new_tokens, self.timeout_s = max_new_tokens, timeout_s
        self.result = LoadResult()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.done_count = 0

    def _one(self) -> str | None:
        """None for a good request, else why it failed."""
        body = json.dumps({"text": "Tell me about the weather", "stream": True,
                           "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0}})
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            if reply.status != 200:
                return f"HTTP {reply.status}: {reply.read()[:120]!r}"
            finished, done = False, False
            for raw in reply:  # one SSE line at a time
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return f"error chunk: {chunk['error']}"
                finished = bool((chunk.get("meta_info") or {}).get("finish_reason")) or finished
            if not done:
                return "stream cut: no [DONE]"
            if not finished:
                return "stream cut: no finished chunk"
            return None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()

    def _client(self) -> None:
        for _ in range(self.per_client):
            if self._stop.is_set():
                with self._lock:
                    self.result.clients_cut_short += 1
                return
            why = self._one()
            with self._lock:
                self.result.total += 1
                self.done_count += 1
                if why is None:
                    self.result.ok += 1
                else:
                    self.result.failures.append(why)

    def start(self) -> "StreamingLoad":
        for _ in range(self.clients):
            thread = threading.Thread(target=self._client, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wait_started(self, count: int = 1, timeout_s: float = 30.0) -> None:
        """Until ``count`` requests have finished (the load reaches the replicas)."""
        deadline = time.monotonic() + timeout_s
        while self.done_count < count and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> "StreamingLoad":
        """Start no more requests; those streaming now finish (and are counted) by ``join``."""
        self._stop.set()
        return self

    def join(self, timeout_s: float = 600.0) -> LoadResult:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.result
