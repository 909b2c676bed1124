"""On the host: one node of a multi-node SGLang server judged before the deployment commits.

Shipped by ``apply/deployment_health.py`` once every node was verified healthy, in an exec of its
own beside the open transaction; stdlib only, Python 3.8+. Prints one JSON line.

    {"mode": MODE_LEADER, "service": SPEC, "pid": PID, "timeout_s": 60}
      -> {"ok": true, "seconds": 0.4}  or  {"ok": false, "error": "..."}
    {"mode": MODE_WORKER, "service": SPEC, "pid": PID}
      -> {"ok": true}  or  {"ok": false, "error": "..."}
    {"mode": MODE_ANSWER, "port": 30000, "timeout_s": 60}     (inspect: the leader's server on its port)
      -> as MODE_LEADER

Why not each node's ``/health``: SGLang's node of rank > 0 runs ``launch_dummy_health_check_server``
(0.5.8 ``srt/utils/common.py:2541``, still in 0.5.23), whose ``/health`` answers 200 whatever its
schedulers do; and the leader's ``/health`` may answer while a worker is gone (without a generation
when ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` is off, ``entrypoints/http_server.py:469``), its
collective left waiting. So the leader must answer a generation within a bound, and a worker's
server must still be the process that was verified, answering, with a log since its start free of
what SGLang writes when a node's scheduler dies (``PEER_FAILURE``).
"""

import json
import re
import time

from gpuops.remote import process_manager, replica_drain
from gpuops.remote.apply_service import Service
from gpuops.remote.node_modes import MODE_ANSWER, MODE_LEADER, MODE_WORKER
from gpuops.remote.service_base import HEALTH_PROBE_TIMEOUT_S
from gpuops.remote.sglang_server import ServerClient


# What a node's log says when its schedulers or its peers failed, read from the releases:
# engine.py's join loop on ranks > 0 (0.5.8 engine.py:988, 0.5.23 engine.py:1025), its SIGQUIT
# handler (0.5.8 engine.py:823, 0.5.23 engine.py:1978), and NCCL's own errors through torch.
PEER_FAILURE = (
    re.compile(r"Scheduler or DataParallelController \d+ terminated with"),
    re.compile(r"Received sigquit from a child process"),
    re.compile(r"NCCL error"),
)


def peer_failure(lines):
    """The first line of ``lines`` that says the node's schedulers or a peer failed, or None."""
    for line in lines:
        if any(p.search(line) for p in PEER_FAILURE):
            return line.strip()[:300]
    return None


def _server(spec, pid):
    """(the service, the running pid) or raises ValueError with why the verified server is gone."""
    service = Service(spec, process_manager, None)
    running, now = service.running()
    if not running:
        raise ValueError("its server (pid %s) exited after its health check" % pid)
    if pid is not None and now is not None and int(now) != int(pid):
        raise ValueError("its server is no longer the one verified (pid %s, now %s)" % (pid, now))
    return service, now


def leader(spec, pid, timeout_s):
    """A first good answer to one short greedy generation, within ``timeout_s``."""
    try:
        service, now = _server(spec, pid)
    except ValueError as exc:
        return {"ok": False, "error": str(exc)}
    return first_answer(service.port, timeout_s)


def first_answer(port, timeout_s):
    """One short greedy generation (the replica drain's question), timed; its error names the bound."""
    started = time.monotonic()
    answer = replica_drain.answer(port, timeout_s)
    if not answer.get("ok"):
        return {"ok": False, "error": "no answer within %gs (%s)" % (timeout_s, answer.get("error"))}
    return {"ok": True, "seconds": round(time.monotonic() - started, 3)}


def worker(spec, pid):
    """The verified server still runs, answers its /health, and its log tells of no failed peer."""
    try:
        service, now = _server(spec, pid)
    except ValueError as exc:
        return {"ok": False, "error": str(exc)}
    client = ServerClient.for_process("http://127.0.0.1:%d" % service.port, now, timeout=HEALTH_PROBE_TIMEOUT_S)
    if not client.healthy(HEALTH_PROBE_TIMEOUT_S):
        return {"ok": False, "error": "its server (pid %s) no longer answers /health" % now}
    said = peer_failure(service.log_tail(400).splitlines())
    if said:
        return {"ok": False, "error": "its server's log says a node failed: %s" % said}
    return {"ok": True}


def main(payload):
    spec, pid, mode = payload.get("service") or {}, payload.get("pid"), payload.get("mode")
    if mode == MODE_LEADER:
        return leader(spec, pid, float(payload.get("timeout_s", 60)))
    if mode == MODE_ANSWER:
        return first_answer(int(payload["port"]), float(payload.get("timeout_s", 60)))
    if mode == MODE_WORKER:
        return worker(spec, pid)
    return {"ok": False, "error": "unknown node check %r" % (mode,)}


if __name__ == "__main__":
    print(json.dumps(main(json.loads((globals().get("GPUOPS_PAYLOAD") or b"{}").decode("utf-8")))))
