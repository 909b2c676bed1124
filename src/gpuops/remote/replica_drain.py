"""On the host: wait until the server holds no request (a drained replica), or ask it one question.

Shipped by ``apply/replicas.py`` after the replica is out of its router; stdlib only, Python 3.8+.
Prints one JSON line.

    {"mode": "drain", "port": 30000, "timeout_s": 120, "settle_s": 0.5, "poll_s": 0.2}
      -> {"drained": true, "in_flight": 0, "source": "/v1/loads", "waited_s": 3.1}
    {"mode": "answer", "port": 30000, "timeout_s": 60}
      -> {"ok": true, "text": "..."}  or  {"ok": false, "error": "..."}

The in-flight count is the server's own, read by the one server client
(``sglang_server.ServerClient.in_flight``, with the server's own ``--api-key``): ``/v1/loads``'
running + waiting requests over every DP rank (SGLang 0.5.x, ``entrypoints/v1_loads.py``), else
``/get_load``'s ``num_reqs`` (running + waiting, ``scheduler_metrics_mixin.get_load``), else
``/metrics``' ``num_running_reqs`` + ``num_queue_reqs``. A server that answers none cannot be
drained safely, and says so.
"""

import json
import time

from gpuops.remote.sglang_server import ServerClient, ServerError, find_server_pid


class NoLoad(Exception):
    pass


_CLIENTS = {}  # type: dict[int, ServerClient]


def _client(port, timeout):
    """The one server client for the replica on ``port`` (its --api-key read from its command line)."""
    if port not in _CLIENTS:
        url = "http://127.0.0.1:%d" % port
        _CLIENTS[port] = ServerClient.for_process(url, find_server_pid(url), timeout=timeout)
    return _CLIENTS[port]


def in_flight(port, timeout=5.0):
    """(requests the server holds, the route that said so); NoLoad when no route answers."""
    seen = _client(port, timeout).in_flight(timeout)
    if seen is None:
        raise NoLoad("none of /v1/loads, /get_load, /metrics answered with request counts")
    return seen.total, seen.source


def drain(port, timeout_s, settle_s=0.5, poll_s=0.2):
    """Wait until the server holds nothing, seen twice ``settle_s`` apart (a request the router had
    already sent may still be arriving), at most ``timeout_s``."""
    started = time.monotonic()
    deadline = started + timeout_s
    zero_since = None
    count, source = None, None
    while True:
        try:
            count, source = in_flight(port)
        except NoLoad as exc:
            return {"drained": False, "error": "the server does not report its requests in flight (%s)" % exc}
        now = time.monotonic()
        if count == 0:
            zero_since = now if zero_since is None else zero_since
            if now - zero_since >= settle_s:
                return {"drained": True, "in_flight": 0, "source": source, "waited_s": round(now - started, 3)}
        else:
            zero_since = None
        if now >= deadline:
            return {"drained": False, "in_flight": count, "source": source, "waited_s": round(now - started, 3)}
        time.sleep(poll_s)


def answer(port, timeout_s):
    """One short greedy generation: the restarted server answers, not only its /health."""
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    try:
        text = _client(port, timeout_s).get_json("/generate", body, timeout=timeout_s).get("text")
    except (ServerError, AttributeError) as exc:
        return {"ok": False, "error": "/generate: %s" % exc}
    if not isinstance(text, str) or not text:
        return {"ok": False, "error": "/generate answered no text"}
    return {"ok": True, "text": text[:80]}


def main(payload):
    port = int(payload["port"])
    if payload.get("mode") == "answer":
        return answer(port, float(payload.get("timeout_s", 60)))
    return drain(port, float(payload["timeout_s"]), float(payload.get("settle_s", 0.5)),
                 float(payload.get("poll_s", 0.2)))


if __name__ == "__main__":
    print(json.dumps(main(json.loads((globals().get("GPUOPS_PAYLOAD") or b"{}").decode("utf-8")))))
