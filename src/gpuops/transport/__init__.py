"""Reaching hosts: one `Connection` per host, one command per phase, hosts in parallel."""

from __future__ import annotations

from gpuops.transport.base import ConnectOptions, Connection, ExecResult
from gpuops.transport.parallel import HostOutcome, Opening, connect, prepare_ssh, run_on_hosts

__all__ = ["ConnectOptions", "Connection", "ExecResult", "HostOutcome", "Opening", "connect", "prepare_ssh", "run_on_hosts"]
