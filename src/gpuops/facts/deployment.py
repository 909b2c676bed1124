"""``inspect host``: the nodes of a multi-node SGLang server (``sglang_deployment``) as one server.

Pure: from the inventory's hosts (their ranks and init address, as apply derives them:
``multi_node.plan_deployments``) and each node's inspected facts, one entry per deployment
with its nodes (rank, leader or worker, running, healthy, release, the flags the node really runs),
the leader's first answer to a generation where it was asked and whether the deployment serves
(every node up and the leader answering: a leader's /health alone is not enough, SGLang's leader may
not notice a dead worker) and warnings: a node down or unanswered, a node whose running --nnodes / --node-rank /
--dist-init-addr differ from the inventory's, nodes that run different configurations (flags or
environment, its own rank aside) or different SGLang releases: a deployment split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence, TypedDict

from gpuops.errors import GpuopsError
from gpuops.facts.collect import HostJSON
from gpuops.facts.to_json import ServerPartJSON
from gpuops.multi_node import Deployment, find_split, plan_deployments

if TYPE_CHECKING:
    from gpuops.inventory import Host

# The flags that differ by node on purpose (and the port each node's own HTTP server takes).
_PER_NODE = ("node_rank",)
_DERIVED = (("nnodes", "--nnodes"), ("node_rank", "--node-rank"), ("dist_init_addr", "--dist-init-addr"))


class NodeJSON(TypedDict):
    """One node of a deployment: its rank and part, whether it answered, runs and is healthy, its
    release and the launch flags the inventory derives for it, as it really runs them."""

    rank: int
    role: str
    answered: bool
    running: bool
    healthy: bool | None
    sglang: str | None
    launch: dict[str, object]


class DeploymentJSON(TypedDict):
    """One multi-node server of ``deployments``; ``answer``: its leader's first answer, as asked."""

    members: list[str]
    leader: str
    init_addr: str
    nnodes: int
    nodes: dict[str, NodeJSON]
    answer: dict[str, object] | None
    serving: bool
    warnings: list[str]


class DeploymentsJSON(TypedDict):
    """The deployment keys of the ``inspect host --json`` document."""

    deployments: dict[str, DeploymentJSON]
    deployments_error: str | None


def deployments_json(hosts: Sequence["Host"], entries: Mapping[str, HostJSON],
                     journals: Mapping[str, object] | None = None,
                     answers: Mapping[str, Mapping[str, object]] | None = None) -> DeploymentsJSON:
    """``{"deployments": {NAME: {...}}, "deployments_error": None | one line}`` (docs/inspect-json.md).
    ``journals``: each node's apply journal as inspect read it (records, else not known), for the
    split left by a client that died between its commits (``apply/deployment_repair.py``).
    ``answers``: each deployment's leader's first answer, where it was asked
    (``apply/deployment_health.leader_answers``)."""

    try:
        found = plan_deployments(hosts, {})
    except GpuopsError as exc:  # the inventory contradicts itself: apply refuses it too
        return {"deployments": {}, "deployments_error": str(exc)}
    return {"deployments": {name: _one(d, entries, journals or {}, (answers or {}).get(name))
                            for name, d in found.items()},
            "deployments_error": None}


def _split_warning(deployment: Deployment, journals: Mapping[str, object]) -> list[str]:
    """The deployment's last run committed on some nodes and rolled back on others: named, with
    the command that rolls it back on every node."""

    known = {name: records if isinstance(records, list) else "its journal was not read"
             for name in deployment.members for records in [journals.get(name)]}
    try:
        split = find_split(deployment.name, known)
    except GpuopsError:
        return []  # a node not read: the lines above say which did not answer
    if split is None:
        return []
    return [f"{split.line()}: `gpuops rollback -l {','.join(split.deployment.members)}` (or the next `gpuops "
            "apply` on its nodes) rolls it back on every node as one"]


# An entry is read with .get: host_json writes every key, a caller's own entries may leave some out.
def _server(entry: HostJSON | None) -> ServerPartJSON | None:
    facts = entry.get("facts") if entry is not None else None
    return facts.get("server") if facts is not None else None


def _one(deployment: Deployment, entries: Mapping[str, HostJSON], journals: Mapping[str, object],
         answer: Mapping[str, object] | None) -> DeploymentJSON:
    nodes: dict[str, NodeJSON] = {}
    warnings: list[str] = []
    for name in deployment.members:
        entry = entries.get(name)
        facts = entry.get("facts") if entry is not None else None
        server = _server(entry)
        software = facts.get("software") if facts is not None else None
        sglang = software.get("sglang") if software is not None else None
        args = dict(server.get("args") or {}) if server is not None else {}
        node: NodeJSON = {
            "rank": deployment.rank(name), "role": "leader" if deployment.rank(name) == 0 else "worker",
            "answered": bool(entry is not None and entry.get("ok")), "running": bool(server and server.get("running")),
            "healthy": server.get("healthy") if server is not None else None,
            "sglang": sglang.get("version") if sglang else None,
            "launch": {key: args.get(key) for key, _ in _DERIVED}}
        nodes[name] = node
        if not node["answered"]:
            error = entry.get("error") if entry is not None else None
            warnings.append(f"{name} (node {node['rank']}) did not answer: {error or 'unknown error'}")
            continue
        if not node["running"]:
            leader = deployment.leader
            leader_server = _server(entries.get(leader))
            # SGLang's leader may not notice a dead worker: its /health answers while requests hang.
            still = (f", although its leader {leader} answers /health" if name != leader
                     and leader_server is not None and leader_server.get("healthy") else "")
            warnings.append(f"{name} (node {node['rank']}) runs no SGLang server: the deployment is down{still}")
            continue
        want = dict(zip((k for k, _ in _DERIVED), deployment.launch_flags(name)[1::2]))
        for key, flag in _DERIVED:
            if args.get(key) is not None and str(args.get(key)) != want[key]:
                warnings.append(f"{name} runs {flag} {args.get(key)}, the inventory makes it {want[key]}")
    running = [n for n in deployment.members if nodes[n]["running"]]
    warnings += _differences(running, entries, nodes)
    warnings += _split_warning(deployment, journals)
    if answer is not None and not answer.get("ok"):
        warnings.append(f"the leader {deployment.leader} gave no first answer: {answer.get('error')}; the deployment "
                        "does not serve, whatever its nodes' /health say")
    # Serving: every node runs and answers its health, and the leader answered a generation.
    serving = (all(node["running"] and node["healthy"] for node in nodes.values())
               and answer is not None and bool(answer.get("ok")))
    return {"members": list(deployment.members), "leader": deployment.leader, "init_addr": deployment.init_addr,
            "nnodes": deployment.nnodes, "nodes": nodes, "answer": dict(answer) if answer is not None else None,
            "serving": serving, "warnings": warnings}


def _config(entry: HostJSON) -> tuple[dict[str, object], dict[str, str]]:
    server = _server(entry)
    if server is None:
        return {}, {}
    args = {k: v for k, v in dict(server.get("args") or {}).items() if k not in _PER_NODE and k != "port"}
    return args, dict(server.get("env") or {})


def _differences(running: list[str], entries: Mapping[str, HostJSON], nodes: Mapping[str, NodeJSON]) -> list[str]:
    """One line per node that runs otherwise than the first running node (its configuration, its release)."""
    if len(running) < 2:
        return []
    first = running[0]
    base_args, base_env = _config(entries[first])
    out = []
    for name in running[1:]:
        args, env = _config(entries[name])
        diffs = [f"--{k.replace('_', '-')} {args.get(k)!r} vs {base_args.get(k)!r}"
                 for k in sorted(set(args) | set(base_args)) if args.get(k) != base_args.get(k)]
        diffs += [f"{k}={env.get(k)!r} vs {base_env.get(k)!r}" for k in sorted(set(env) | set(base_env))
                  if env.get(k) != base_env.get(k)]
        if diffs:
            out.append(f"{name} runs a different configuration from {first} (a split deployment): " + "; ".join(diffs))
        if nodes[name]["sglang"] != nodes[first]["sglang"]:
            out.append(f"{name} runs SGLang {nodes[name]['sglang']}, {first} {nodes[first]['sglang']}")
    return out


def report_lines(view: DeploymentsJSON) -> list[tuple[str, str | None]]:
    """The text report's lines (text, style) for ``deployments_json``'s result."""
    lines: list[tuple[str, str | None]] = []
    if view["deployments_error"]:
        lines.append((f"DEPLOYMENT  {view['deployments_error']}", "yellow"))
    for name, d in view["deployments"].items():
        answer = d["answer"]
        seconds = answer.get("seconds") if answer is not None else None
        said = ("" if answer is None else f"; first answer in {_seconds(seconds)} s" if answer.get("ok")
                else "; NO first answer from the leader")
        lines.append((f"== deployment {name}: one SGLang server over {d['nnodes']} nodes "
                      f"(leader {d['leader']}, --dist-init-addr {d['init_addr']}): "
                      f"{'serving' if d['serving'] else 'NOT serving'}{said}", "bold"))
        for host, node in d["nodes"].items():
            state = ("did not answer" if not node["answered"] else "not running" if not node["running"]
                     else "healthy" if node["healthy"] else "running, not healthy")
            lines.append((f"   node {node['rank']}  {host:<12} {node['role']:<7} {state:<22} "
                          f"sglang {node['sglang'] or '?'}", None))
        lines += [(f"WARNING  {w}", "yellow") for w in d["warnings"]]
    return lines


def _seconds(value: object) -> str:
    """A first answer's time as the report shows it (one decimal); as given when it is no number."""
    return f"{value:.1f}" if isinstance(value, (int, float)) else str(value)
