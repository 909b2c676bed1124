"""On the host: wait until the server holds no request (a drained replica), or ask it one question.

Shipped by ``apply/replicas.py`` after the replica is out of its router; stdlib only, Python 3.8+.
Prints one JSON line.

    {"mode": "drain", "port": 30000, "timeout_s": 120, "settle_s": 0.5, "poll_s": 0.2}
      -> {"drained": true, "in_flight": 0, "source": "/v1/loads", "waited_s": 3.1}
    {"mode": "answer", "port": 30000, "timeout_s": 60}
      -> {"ok": true, "text": "..."}  or  {"ok": false, "error": "..."}

The in-flight count is the server's own (``in_flight``: the one place it is read; issue 26's
server client replaces it once landed): ``/v1/loads``' running + waiting requests over every DP
rank (SGLang 0.5.x, ``entrypoints/v1_loads.py``), else ``/get_load``'s ``num_reqs`` (running +
waiting, ``scheduler_metrics_mixin.get_load``). A server that answers neither cannot be drained
safely, and says so.
"""

import json
import time
import urllib.error
import urllib.request

LOAD_ROUTES = ("/v1/loads", "/get_load")


class NoLoad(Exception):
    pass


def _get(port, path, timeout):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as reply:
        return json.loads(reply.read().decode("utf-8"))


def in_flight(port, timeout=5.0):
    """(requests the server holds, the route that said so); NoLoad when no route answers."""
    problems = []
    for path in LOAD_ROUTES:
        try:
            body = _get(port, path, timeout)
        except urllib.error.HTTPError as exc:
            problems.append("%s: HTTP %d" % (path, exc.code))
            continue
        except (OSError, ValueError) as exc:
            problems.append("%s: %s" % (path, exc))
            continue
        try:
            if path == "/v1/loads":
                rows = body["loads"]
                return sum(int(r.get("num_running_reqs") or 0) + int(r.get("num_waiting_reqs") or 0)
                           for r in rows), path
            rows = body if isinstance(body, list) else [body]
            return sum(int(r.get("num_reqs") or 0) for r in rows), path
        except (KeyError, TypeError, ValueError, AttributeError):
            problems.append("%s: an answer without request counts" % path)
    raise NoLoad("; ".join(problems))


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
    body = json.dumps({"text": "The capital of France is",
                       "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()
    request = urllib.request.Request("http://127.0.0.1:%d/generate" % port, data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            text = json.loads(reply.read().decode("utf-8")).get("text")
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": "/generate answered HTTP %d" % exc.code}
    except (OSError, ValueError, AttributeError) as exc:
        return {"ok": False, "error": "/generate: %s: %s" % (type(exc).__name__, exc)}
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
