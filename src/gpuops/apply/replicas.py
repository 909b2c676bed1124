"""Replicas behind an SGLang router: each restart is drained first, so a rolling change loses no request.

A host whose variables name ``sglang_router_url`` is a replica behind that router (sglang-router,
the Rust gateway on PyPI). When its run restarts the server, gpuops, from the client:

  1. takes the replica out of the router (``DELETE /workers/{id}``) and waits until ``GET /workers``
     no longer lists it (the router sends it nothing new);
  2. waits on the host until the server holds no request (``remote/replica_drain.py``), at most
     ``sglang_drain_timeout`` seconds (default 120); still busy then: it is put back, unchanged;
  3. runs the transaction (change, restart, health) with one more check before the commit: a first
     good answer from ``/generate`` (no answer rolls the change back);
  4. puts the replica back (``POST /workers {"url": ...}``) -- after a commit or a rollback alike,
     the old setting serves again after a rollback -- and waits until the router lists it healthy
     (``sglang_router_health_timeout``, default 60 s) before the roll moves on.

The router's worker API (sglang-router 0.2 or 0.3, told apart by asking the router) is
``apply/router_api.py``. The replica's URL as the router knows it: ``sglang_worker_url``, else
``http://ADDRESS:sglang_port``, ADDRESS being the address gpuops connects to (``transport/address.py``).
Everything is checked before any host is touched (``preflight``): every router answers with a worker
API gpuops knows, every replica is one of its workers, and no replica is the router itself.

A replica gpuops took out is recorded at home (``<state>/gpuops/replicas-out/``, beside the home
journal) before the router is asked, and the record goes once it is back: a run that died between
the two (the client killed, the connection lost) leaves the record, and the next run on that
replica finds it missing from the router *with* the record, rolls it as one already out (no
second removal, nothing to drain) and puts it back; a replica missing without a record was taken
out by someone else, and is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.host_call import module_answer
from gpuops.apply.router_api import Router, RouterError, RouterUnreachable, Worker, comparable, normal_url
from gpuops.errors import GpuopsError
from gpuops.plan.varcheck import seconds_var
from gpuops.transport.address import connect_address
from gpuops.apply.journal import home_journal_path
from gpuops.remote.sglang_argv import flag_value
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport import Connection

ROUTER_VAR = "sglang_router_url"
WORKER_URL_VAR = "sglang_worker_url"
ROUTER_KEY_VAR = "sglang_router_api_key"
DRAIN_VAR, DRAIN_DEFAULT_S = "sglang_drain_timeout", 120.0
ROUTER_HEALTH_VAR, ROUTER_HEALTH_DEFAULT_S = "sglang_router_health_timeout", 60.0
_LISTING_TIMEOUT_S = 30.0  # the router's job queue applies a removal within this
_POLL_S = 0.2


@frozen
class Replica:
    """A host that serves behind an SGLang router (``sglang_router_url``): the router, its URL there, its drain
    and health timeouts, and how the router listed it before the run."""

    host: str
    router: Router
    worker_url: str
    drain_timeout_s: float
    healthy_timeout_s: float
    left_out: bool = False  # out of the router since an earlier gpuops run that did not finish
    listed: bool = True     # the router lists it (a replica whose server never ran is not listed yet)
    listing: str = ""       # the router's workers, as shown when it is not one of them
    unreachable: str | None = None  # the router could not be reached before the run: why

    def plan_line(self, starting: bool = False) -> str:
        if self.unreachable is not None:
            what = ("its server is started and healthy, but it cannot be put behind the router yet (the run "
                    "fails, and the next apply puts it in)") if starting else "no running replica is restarted"
            return f"{self.unreachable}: {what}"
        if starting:
            join = ("put in the router (POST /workers) unless the router lists it by itself" if not self.listed
                    else "awaited healthy in the router, which lists it already")
            return (f"{self.worker_url} does not serve yet: it is started (nothing to drain), a first answer is "
                    f"checked, then it is {join}, at most {self.healthy_timeout_s:g} s ({ROUTER_HEALTH_VAR})")
        if self.left_out:
            return (f"{self.worker_url} was taken out of router {self.router.url} by an earlier gpuops run that did "
                    "not finish: this run puts it back once it serves (awaited healthy in the router, at most "
                    f"{self.healthy_timeout_s:g} s)")
        return (f"{self.worker_url} is a replica behind router {self.router.url}: before its restart it is taken out "
                f"of the router and drained (at most {self.drain_timeout_s:g} s, {DRAIN_VAR}); after the restart a "
                f"first answer is checked, then it is put back and awaited healthy in the router (at most "
                f"{self.healthy_timeout_s:g} s) before the roll moves on")


def replica_for(host: "Host", variables: Mapping[str, Any]) -> Replica | None:
    """The host as a replica of its router (None: no ``sglang_router_url``), checked offline."""
    router_url = variables.get(ROUTER_VAR)
    if router_url in (None, ""):
        return None
    if not isinstance(router_url, str):
        raise GpuopsError(f"{host.name}: {ROUTER_VAR} must be a URL, not {router_url!r}")
    worker_url = variables.get(WORKER_URL_VAR) or default_worker_url(host, variables)
    for name, url in ((ROUTER_VAR, router_url), (WORKER_URL_VAR, str(worker_url))):
        try:
            normal_url(url)
        except ValueError as exc:
            raise GpuopsError(f"{host.name}: {name}: {exc}") from None
    if normal_url(str(worker_url)) == normal_url(router_url):
        raise GpuopsError(f"{host.name}: its server {worker_url} is the router {ROUTER_VAR} names: the router "
                          "itself is never taken out (set sglang_worker_url to the replica's own URL)")
    key = variables.get(ROUTER_KEY_VAR)
    return Replica(host=host.name, router=Router(router_url.rstrip("/"), str(key) if key else None),
                   worker_url=str(worker_url),
                   drain_timeout_s=seconds_var(variables, DRAIN_VAR, DRAIN_DEFAULT_S, host.name),
                   healthy_timeout_s=seconds_var(variables, ROUTER_HEALTH_VAR, ROUTER_HEALTH_DEFAULT_S, host.name))


def default_worker_url(host: "Host", variables: Mapping[str, Any]) -> str:
    """``http://ADDRESS:sglang_port``, ADDRESS being where gpuops itself connects (``ansible_host``, an
    ssh-config alias's ``HostName``, else the inventory name): the router reaches the replica there."""
    address = connect_address(host)
    address = f"[{address}]" if ":" in address else address  # an IPv6 address in a URL
    return f"http://{address}:{variables.get('sglang_port', 30000)}"


def preflight(hosts: Sequence["Host"], extra: ExtraVars) -> dict[str, Replica]:
    """Every replica of the run, checked against its router before any host is touched: one clear
    error (exit 2) when a router refuses or speaks no worker API gpuops knows. What a replica the
    router does not list, or a router that does not answer, means depends on whether its server
    runs: ``refusal`` decides, per host, once that is gathered."""
    replicas: dict[str, Replica] = {}
    for host in hosts:
        replica = replica_for(host, extra.for_host(host))
        if replica is not None:
            replicas[host.name] = replica
    detected: dict[Router, tuple[Router, list[Worker]] | RouterUnreachable] = {}
    for replica in list(replicas.values()):
        if replica.router not in detected:
            try:
                detected[replica.router] = replica.router.detect()
            except RouterUnreachable as exc:  # down (a first deploy may bring its replicas up before it)
                detected[replica.router] = exc
        found = detected[replica.router]
        if isinstance(found, RouterUnreachable):
            replicas[replica.host] = replace(replica, unreachable=str(found))
            continue
        router, workers = found
        replica = replicas[replica.host] = replace(replica, router=router)
        if normal_url(replica.worker_url) in {comparable(w.url) for w in workers}:
            continue
        replicas[replica.host] = replace(replica, listed=False, left_out=_record_path(replica).exists(),
                                         listing=", ".join(sorted(w.url for w in workers)) or "none")
    return replicas


def refusal(replica: Replica, starting: bool, restarting: bool) -> str | None:
    """Why this replica's run must not go on (nothing changed), now that its server's state is known;
    None when it may. ``starting``: its server does not run and the run starts it (a first deploy:
    nothing to drain, it joins the router once it serves); ``restarting``: a running server restarts."""
    if starting:
        return None
    if replica.unreachable is not None:
        if not restarting:
            return None  # nothing stops: the router is not needed
        return (f"{replica.unreachable}: a running replica is restarted only once it is out of its router and "
                "drained; nothing changed")
    if not replica.listed and not replica.left_out:
        return (f"{replica.worker_url} is not one of router {replica.router.url}'s workers ({replica.listing}), yet "
                f"its server runs; add it to the router, or set {WORKER_URL_VAR} to the URL the router knows it by")
    return None


def replica_warnings(hosts: Sequence["Host"], extra: ExtraVars, replicas: Mapping[str, Replica],
                     rolling: bool) -> dict[str, str]:
    """Hosts rolled with --serial that serve the same model and name no router: their restarts drop
    the requests they hold. One warning per such host."""
    if not rolling:
        return {}
    by_model: dict[str, list[str]] = {}
    for host in hosts:
        if host.name in replicas:
            continue
        model = _model_path(extra.for_host(host))
        if model:
            by_model.setdefault(model, []).append(host.name)
    out: dict[str, str] = {}
    for model, names in by_model.items():
        if len(names) < 2:
            continue
        for name in names:
            out[name] = (f"{', '.join(names)} serve the same model ({model}) and are rolled with --serial, but name "
                         f"no router ({ROUTER_VAR}): each restart drops the requests that replica holds; name the "
                         "router they serve behind to take each out and drain it first")
    return out


def _model_path(variables: Mapping[str, Any]) -> str | None:
    args = variables.get("sglang_args")
    if not isinstance(args, list):
        return None
    words = [str(a) for a in args] + [str(a) for a in variables.get("sglang_extra_args") or [] if isinstance(a, (str, int))]
    served = flag_value(words, "--served-model-name")
    if served:
        return served
    # The model's own name: replicas keep their weights wherever each host does (/models/X, /data/X).
    value = flag_value(words, "--model-path") or flag_value(words, "--model")
    return value.rstrip("/").rsplit("/", 1)[-1] or None if isinstance(value, str) else None


# ---------------------------------------------------------------- one replica's roll


def _host_call(conn: "Connection", variables: Mapping[str, Any], payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    return module_answer(conn, variables, "replica_drain", payload, timeout, f"{conn.host.name}: the drain helper")


def _await(what: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if what():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _record_path(replica: Replica) -> Path:
    key = hashlib.sha256(f"{normal_url(replica.router.url)} {normal_url(replica.worker_url)}".encode()).hexdigest()
    return home_journal_path().parent / "replicas-out" / f"{key[:24]}.json"


def _record_out(replica: Replica) -> None:
    path = _record_path(replica)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"host": replica.host, "router": replica.router.url, "worker_url": replica.worker_url,
                               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    os.replace(tmp, path)


def record_joining(replica: Replica) -> None:
    """A replica not in its router whose server this run starts: recorded at home as one out of the
    router, so that a run that cannot put it in (the router down, the client killed) leaves word and
    the next run puts it in (``left_out``)."""
    if not replica.listed or replica.unreachable is not None:
        _record_out(replica)


def take_out(replica: Replica) -> None:
    """Out of the router, and awaited until the router lists it no more (recorded at home first)."""
    if replica.left_out:
        return  # an earlier run took it out: the router sends it nothing
    worker = replica.router.find(replica.worker_url)
    if worker is None:
        raise RouterError(f"{replica.host}: {replica.worker_url} is no longer one of router {replica.router.url}'s "
                          "workers; nothing changed")
    _record_out(replica)  # before the router is asked: a run killed after it still leaves word
    replica.router.remove(worker)
    if not _await(lambda: replica.router.find(replica.worker_url) is None, _LISTING_TIMEOUT_S):
        raise RouterError(f"{replica.host}: router {replica.router.url} still lists {replica.worker_url} "
                          f"{_LISTING_TIMEOUT_S:g} s after its removal")


def drain(replica: Replica, conn: "Connection", variables: Mapping[str, Any], port: int) -> str:
    """Wait on the host until the server holds no request; the note to report. Raises when it
    cannot be told or the requests outlast ``sglang_drain_timeout``."""
    if replica.left_out:
        return f"out of router {replica.router.url} since an earlier gpuops run that did not finish: nothing to drain"
    answer = _host_call(conn, variables, {"mode": "drain", "port": port, "timeout_s": replica.drain_timeout_s},
                        timeout=replica.drain_timeout_s + 60)
    if answer.get("drained"):
        return (f"drained: out of router {replica.router.url}, no request in flight after "
                f"{float(answer.get('waited_s') or 0):.1f} s ({answer.get('source')})")
    if answer.get("error"):
        raise GpuopsError(f"{replica.host}: cannot drain: {answer['error']}")
    raise GpuopsError(f"{replica.host}: still {answer.get('in_flight')} request(s) in flight after "
                      f"{replica.drain_timeout_s:g} s ({DRAIN_VAR})")


def first_answer(replica: Replica, conn: "Connection", variables: Mapping[str, Any],
                 port: int) -> Callable[[], tuple[bool, str | None]]:
    """The check before the commit: the restarted server answers a generation."""

    def check() -> tuple[bool, str | None]:
        try:
            answer = _host_call(conn, variables, {"mode": "answer", "port": port, "timeout_s": 60}, timeout=90)
        except Exception as exc:  # a transport error is a failed check: the replica must answer
            return False, f"the restarted server's first answer could not be asked for ({exc})"
        if answer.get("ok"):
            return True, None
        return False, f"the restarted server gave no first answer: {answer.get('error')}"

    return check


def put_back(replica: Replica, joining: bool = False) -> str:
    """Back into the router (``joining``: in it for the first time), awaited until the router lists it
    healthy; the note to report. A router that lists it already (by itself) is not asked to add it."""
    added = replica.router.find(replica.worker_url) is None
    if added:
        replica.router.add(replica.worker_url)
    started = time.monotonic()

    def healthy() -> bool:
        worker = replica.router.find(replica.worker_url)
        return worker is not None and worker.healthy

    if not _await(healthy, replica.healthy_timeout_s):
        raise RouterError(f"{replica.host}: router {replica.router.url} did not list {replica.worker_url} as healthy "
                          f"within {replica.healthy_timeout_s:g} s ({ROUTER_HEALTH_VAR}) after it was put back")
    _record_path(replica).unlink(missing_ok=True)
    waited = time.monotonic() - started
    if joining:
        how = "put in with POST /workers" if added else "listed by the router itself"
        return f"joined: router {replica.router.url} lists it healthy after {waited:.1f} s ({how})"
    return f"put back: router {replica.router.url} lists it healthy after {waited:.1f} s"
