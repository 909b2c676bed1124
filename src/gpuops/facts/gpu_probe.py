"""The one probe that asks nvidia-smi everything: query table, banner, topology, P2P, at once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from gpuops.facts.gpu import GpuQuery, SmiBanner, parse_banner, parse_procfs, parse_query
from gpuops.facts.nvidia_smi import QUERY_FIELDS, batch_script, new_token, split_batch
from gpuops.facts.topology import P2PMatrix, TopologyMatrix, parse_p2p, parse_topo
from gpuops.gather import Probe, ProbeOutput

PROBE_NAME = "gpu.smi"

# name -> nvidia-smi arguments. The query's field list is the one the fixtures were captured with.
SMI_COMMANDS: dict[str, tuple[str, ...]] = {
    "query": (f"--query-gpu={QUERY_FIELDS}", "--format=csv"),
    "banner": (),
    "topo": ("topo", "-m"),
    "p2p": ("topo", "-p2p", "r"),
}


@dataclass(frozen=True)
class SmiFacts:
    query: GpuQuery
    banner: SmiBanner
    topo: TopologyMatrix
    p2p: P2PMatrix


def parse_smi(out: ProbeOutput, token: str) -> SmiFacts:
    runs = split_batch(out, list(SMI_COMMANDS), token)
    query, banner = parse_query(runs["query"]), parse_banner(runs["banner"])
    if not query.known and "procfs" in runs:
        query, banner = parse_procfs(runs["procfs"].stdout, query.reason)
    return SmiFacts(
        query=query,
        banner=banner,
        topo=parse_topo(runs["topo"]),
        p2p=parse_p2p(runs["p2p"]),
    )


def smi_probe() -> Probe[SmiFacts]:
    token = new_token()
    return Probe(PROBE_NAME, batch_script(SMI_COMMANDS, token), partial(parse_smi, token=token))
