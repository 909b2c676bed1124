"""A multi-node server's health before its commit: judged by every node, not by the leader's /health.

Users of SGLang's multi-node recipes report a leader that does not notice a dead worker: its
``/health`` still answers (without a generation when ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` is
off), its collective waits for the gone rank and every request hangs; and a node of rank > 0
answers ``/health`` from a dummy server whatever its schedulers do. So once every node was verified
healthy (``DeploymentTxn.commit_gate``), before any node commits:

  1. the leader answers one short generation within ``sglang_deployment_answer_timeout`` seconds
     (default 60): the whole server computes, every rank taking part;
  2. then each worker's server is still the process that was verified, answers, and its log since
     its start tells of no failed scheduler or peer (``remote/node_health.py``).

Any node failing either rolls every node back. Each check is an exec of its own on the node's
connection, beside its open transaction. ``inspect host`` asks the same first answer of a running
deployment's leader (``leader_answers``; facts/deployment.py turns it into ``serving`` and warnings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuops.apply.host_call import module_answer
from gpuops.errors import GpuopsError
from gpuops.plan.varcheck import seconds_var
from gpuops.remote.node_modes import MODE_ANSWER, MODE_LEADER, MODE_WORKER
from gpuops.multi_node import plan_deployments
from gpuops import transport

if TYPE_CHECKING:
    from gpuops.apply.deployment import DeploymentTxn
    from gpuops.inventory import Host
    from gpuops.transport import Connection, ConnectOptions

ANSWER_VAR, ANSWER_DEFAULT_S = "sglang_deployment_answer_timeout", 60.0

Check = Callable[[], tuple[bool, str | None]]


def answer_timeout(variables: Mapping[str, Any], host: str) -> float:
    return seconds_var(variables, ANSWER_VAR, ANSWER_DEFAULT_S, host)


def gate(txn: "DeploymentTxn", host: str, checks: Check | None, conn: "Connection", variables: Mapping[str, Any],
         payload: Mapping[str, Any], verified_pid: Callable[[], int | None]) -> Check:
    """The node's ``on_verified`` in its deployment: its own ``checks``, every node healthy, then the
    whole server judged (this module's docstring); ``verified_pid``: the server's pid in the host's
    ``verified`` event, known by then."""
    check = node_check(conn, variables, payload.get("service") or {}, host == txn.deployment.leader, verified_pid)
    return txn.commit_gate(host, checks, check)


def node_check(conn: "Connection", variables: Mapping[str, Any], service: Mapping[str, Any], leader: bool,
               verified_pid: Callable[[], int | None]) -> Check:
    """The node's check before the deployment commits (the leader: a first answer; a worker: its
    process, health and log), as (go on?, why not)."""
    timeout = answer_timeout(variables, conn.host.name)

    def check() -> tuple[bool, str | None]:
        payload = {"mode": MODE_LEADER if leader else MODE_WORKER, "service": dict(service), "pid": verified_pid(),
                   "timeout_s": timeout}
        try:
            answer = _host_call(conn, variables, payload, timeout=timeout + 60)
        except Exception as exc:  # the node cannot be asked: it cannot be shown to serve
            return False, f"the node could not be checked before the commit ({exc})"
        if answer.get("ok"):
            return True, None
        return False, ("the leader gave no first answer: " if leader else "") + str(answer.get("error"))

    return check


def _host_call(conn: "Connection", variables: Mapping[str, Any], payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    return module_answer(conn, variables, "node_health", payload, timeout, "the node check")


def leader_answers(hosts: Sequence["Host"], entries: Mapping[str, Mapping[str, Any]],
                   options: "ConnectOptions") -> dict[str, dict[str, Any]]:
    """``inspect host``: each deployment whose every node runs, its leader's first answer, asked
    on the leader's host and bounded by its ``sglang_deployment_answer_timeout``: ``{NAME: {"ok",
    "error", "seconds"}}``. A deployment with a node down is down already: its leader is not asked."""
    try:
        found = plan_deployments(hosts, {})
    except GpuopsError:
        return {}  # the inventory contradicts itself: facts/deployment.py says so
    by_name = {h.name: h for h in hosts}
    out: dict[str, dict[str, Any]] = {}
    for name, deployment in found.items():
        servers = [((entries.get(n) or {}).get("facts") or {}).get("server") or {} for n in deployment.members]
        port = servers[0].get("port")
        if not all(s.get("running") for s in servers) or not isinstance(port, int):
            continue
        leader = by_name[deployment.leader]
        variables = dict(leader.vars or {})
        try:
            timeout = answer_timeout(variables, leader.name)
            conn = transport.connect(leader, options)
            try:
                answer = _host_call(conn, variables, {"mode": MODE_ANSWER, "port": port, "timeout_s": timeout},
                                    timeout=timeout + 60)
            finally:
                conn.close()
        except Exception as exc:  # the leader's host cannot be asked now: said, not raised
            answer = {"ok": False, "error": f"the leader could not be asked ({exc})"}
        out[name] = {"ok": bool(answer.get("ok")), "error": None if answer.get("ok") else str(answer.get("error")),
                     "seconds": answer.get("seconds")}
    return out
