"""The stand-in's nodes of one multi-node server: ``--nnodes N --node-rank R --dist-init-addr HOST:PORT``.

What SGLang 0.5.8 does, simulated over one TCP connection per worker (stdlib only, Python 3.8+;
a sibling of ``standin_server.py``, copied with it: ``hosts.STANDIN_SIBLINGS``):

  * node 0 (the leader) listens at the init address and is not healthy until every other rank has
    joined (SGLang's distributed init waits for all ranks); it serves the HTTP API;
  * a node of rank > 0 may start first: it keeps trying the init address (at most
    ``GPUOPS_STANDIN_JOIN_TIMEOUT_S``, default 300 s), and once everyone has joined serves only
    ``/ping``, ``/health`` and ``/health_generate`` (``launch_dummy_health_check_server`` in
    ``srt/utils/common.py``: non-zero ranks run no tokenizer and no API);
  * when a node's peer goes away (a worker dies, or the leader), it logs an NCCL-style error and
    exits 1: one dead node takes the whole server down, as it does with SGLang when the collective
    fails; so does a rank > 0 whose leader goes away while it waits for the others to join, and a
    leader one of whose ranks went away before the last joined;
  * or, with ``GPUOPS_STANDIN_LEADER_MISSES_DEAD_WORKER=1`` on node 0, the leader that does not
    notice (a worker whose host vanished leaves the leader's collective waiting, not failing): it
    logs nothing, keeps answering ``/health`` and ``/server_info`` (SGLang 0.5.8's ``/health`` is 200
    without a generation when ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` is off,
    ``entrypoints/http_server.py:469``; rank > 0's dummy server always is) and every generation from
    then on hangs (``lost``).

Checked at start, as SGLang's ``ServerArgs`` checks them: ``tp_size * pp_size`` divisible by
``nnodes``, ``0 <= node_rank < nnodes``, and an init address when ``nnodes > 1``.
"""

import os
import socket
import threading
import time

WORKER_ROUTES = ("/ping", "/health", "/health_generate")


class NodeArgsError(Exception):
    pass


class NodeGroup(object):
    def __init__(self, server_args, environ, log, on_lost):
        self.nnodes = int(server_args.get("nnodes") or 1)
        self.rank = int(server_args.get("node_rank") or 0)
        self.addr = server_args.get("dist_init_addr")
        self.log = log
        self.on_lost = on_lost  # called with why, from a thread: the process must end
        self.join_timeout_s = float(environ.get("GPUOPS_STANDIN_JOIN_TIMEOUT_S") or 300)
        self.joined = threading.Event()
        self.lost = threading.Event()  # a peer is gone and this node lives on: its generations hang
        self.misses_dead_workers = self.rank == 0 and environ.get("GPUOPS_STANDIN_LEADER_MISSES_DEAD_WORKER") == "1"
        if self.nnodes < 1 or not 0 <= self.rank < self.nnodes:
            raise NodeArgsError("node_rank %d must be in [0, nnodes=%d)" % (self.rank, self.nnodes))
        tp = int(server_args.get("tp_size") or 1) * int(server_args.get("pp_size") or 1)
        if tp % self.nnodes:
            raise NodeArgsError("AssertionError: tp_size must be divisible by number of nodes")
        if self.nnodes > 1:
            host, sep, port = str(self.addr or "").rpartition(":")
            if not sep or not host or not port.isdigit():
                raise NodeArgsError("--dist-init-addr HOST:PORT is required with --nnodes %d (got %r)"
                                    % (self.nnodes, self.addr))
            self.host, self.port = host.strip("[]"), int(port)
        else:
            self.joined.set()

    @property
    def multi(self):
        return self.nnodes > 1

    def serves(self, path):
        """Does this node answer ``path`` over HTTP? (rank > 0: the dummy health server only)."""
        return self.rank == 0 or path in WORKER_ROUTES

    def start(self):
        if not self.multi:
            return
        target = self._lead if self.rank == 0 else self._join
        thread = threading.Thread(target=target)
        thread.daemon = True
        thread.start()

    # ---- node 0
    def _lead(self):
        server = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.host, self.port))
        except OSError as exc:
            self.on_lost("cannot listen at the init address %s:%d: %s" % (self.host, self.port, exc))
            return
        server.listen(self.nnodes)
        self.log("node 0 of %d: waiting at %s:%d for %d node(s)" % (self.nnodes, self.host, self.port,
                                                                    self.nnodes - 1))
        peers = {}
        while len(peers) < self.nnodes - 1:
            conn, _ = server.accept()
            rank = _read_rank(conn)
            if rank is None or rank in peers or not 0 < rank < self.nnodes:
                conn.close()  # not one of ours, or a rank twice: refused, as a mismatched init would be
                continue
            peers[rank] = conn
            self.log("node %d joined (%d of %d)" % (rank, len(peers) + 1, self.nnodes))
        for rank, conn in peers.items():
            try:
                conn.sendall(b"ready\n")
            except OSError:
                # A rank that joined and died before the last one came (its reset is seen only now):
                # the group cannot form, as NCCL's init fails. Before, this thread died here and the
                # leader lived on, never joined and never healthy (the twin of the worker's case in _join).
                self._peer_gone("node %d" % rank)
                return
        self.joined.set()
        self.log("all %d nodes joined" % self.nnodes)
        for rank, conn in peers.items():
            watcher = threading.Thread(target=self._watch, args=(conn, "node %d" % rank))
            watcher.daemon = True
            watcher.start()

    # ---- node > 0
    def _join(self):
        deadline = time.monotonic() + self.join_timeout_s
        while True:
            try:
                conn = socket.create_connection((self.host, self.port), timeout=2)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    self.on_lost("node 0 never answered at %s:%d within %.0f s" % (self.host, self.port,
                                                                                  self.join_timeout_s))
                    return
                time.sleep(0.2)
        try:
            conn.settimeout(None)
            conn.sendall(("rank %d\n" % self.rank).encode())
            answer = _read_line(conn)
        except OSError as exc:
            # torch's TCPStore retries its connect and first ping only: a reset once this rank waits
            # for the others (node 0 stopped meanwhile) fails init_process_group, and the node exits.
            # Before, the join thread died here and the process lived on, never joined, never healthy.
            self.on_lost("DistNetworkError: node 0 at %s:%d went away while node %d waited for the others: %s"
                         % (self.host, self.port, self.rank, exc))
            return
        if answer != b"ready":
            self.on_lost("node 0 at %s:%d refused node %d" % (self.host, self.port, self.rank))
            return
        self.joined.set()
        self.log("node %d of %d: joined node 0 at %s:%d" % (self.rank, self.nnodes, self.host, self.port))
        self._watch(conn, "node 0")

    def _watch(self, conn, who):
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        self._peer_gone(who)

    def _peer_gone(self, who):
        if self.misses_dead_workers:
            self.lost.set()  # the leader's collective waits for a peer that never comes: nothing is said
            return
        self.on_lost("NCCL error: remote process exited or there was a network error (%s is gone)" % who)


def _read_line(conn):
    data = b""
    while not data.endswith(b"\n") and len(data) < 64:
        chunk = conn.recv(1)
        if not chunk:
            break
        data += chunk
    return data.strip()


def _read_rank(conn):
    conn.settimeout(5)
    try:
        line = _read_line(conn)
    except OSError:
        return None
    conn.settimeout(None)
    word, _, number = line.partition(b" ")
    return int(number) if word == b"rank" and number.isdigit() else None


def die(log, why):
    """A node whose peer is gone ends the process, as SGLang's scheduler does (exit 1)."""
    log(why)
    log("Received sigquit from a child process. It usually means the child failed.")
    os._exit(1)
