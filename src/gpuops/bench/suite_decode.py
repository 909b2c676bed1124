"""How a stored ``decode`` result reads (one stream at a time): its per-request figures; the
headline and export rows are the defaults of ``suite_base``. Pure."""

from __future__ import annotations

from typing import Any, Mapping

from gpuops.bench.suite_base import Figures, headline, levels, request_figures

__all__ = ["figures", "headline", "levels"]


def figures(summary: Mapping[str, Any], result: Mapping[str, Any]) -> Figures:
    return request_figures(summary)
