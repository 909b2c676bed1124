"""Marks on figures that come from the lab's stand-in server, wherever gpuops prints or draws them.

A stand-in's figures are a prediction of its speed model (``gpuops/lab/speed_model.json``), never
a measurement. Every table cell holding one carries ``(sim)``, a better/worse verdict that involves
one carries it too, and every plot drawn from one carries a visible stamp on the image itself
(``stamp_figure``), so a copied cell or a cropped screenshot still says so. New tables and charts
call these helpers rather than spelling the marks again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from gpuops.bench.record import JSONObject, ResultDocument, objects

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SIM_MARK = "(sim)"
STAMP_GID = "gpuops-simulated-stamp"  # the stamp's artists carry it (tests find them by it)
UNRECORDED = "unrecorded"  # a result from before the model was recorded
DATA_FILE = "gpuops/lab/speed_model.json"


def is_simulated(result: ResultDocument) -> bool:
    return bool((result.get("server") or {}).get("simulated"))


def model_label(result: ResultDocument) -> str | None:
    """The stand-in model a result's figures come from (``rtx-pro-6000-pcie-x8 v2``), None if measured."""
    if not is_simulated(result):
        return None
    model = (result.get("server") or {}).get("speed_model") or {}
    return str(model.get("label") or UNRECORDED)


def mark(text: str, simulated: bool) -> str:
    """``text`` with ``(sim)`` appended when the figure is simulated (empty cells stay empty)."""
    return f"{text} {SIM_MARK}" if simulated and text not in ("", "-") else text


def verdict(better: bool | None, simulated: bool) -> str:
    """better/worse; a difference that involves a simulated figure is never called so unmarked."""
    if better is None:
        return ""
    return ("better" if better else "worse") + (f" {SIM_MARK}" if simulated else "")


def labels_of(results: Iterable[ResultDocument]) -> list[str]:
    return sorted({label for label in (model_label(r) for r in results) if label})


def model_figures(results: Iterable[ResultDocument]) -> dict[str, list[JSONObject]]:
    """Per stand-in model: the figures its predictions used (name, value, unit, basis, source, note)."""
    out: dict[str, list[JSONObject]] = {}
    for result in results:
        label = model_label(result)
        if label and label not in out:
            model = (result.get("server") or {}).get("speed_model") or {}
            out[label] = objects(model.get("figures"))
    return out


def figure_basis(figure: Mapping[str, object]) -> str:
    """``published`` / ``measured`` / ``derived`` / ``assumption``, and whether it rests on one."""
    return str(figure.get("basis")) + (" (on an assumption)" if figure.get("on_assumption") else "")


def stamp_text(labels: Sequence[str]) -> str | None:
    return f"SIMULATED — stand-in model {', '.join(labels)}" if labels else None


def footnote(labels: Sequence[str]) -> str | None:
    """One line under a table that holds ``(sim)`` figures."""
    if not labels:
        return None
    return (f"{SIM_MARK}: simulated by the lab's stand-in server, model {', '.join(labels)}: the model's "
            f"prediction from the figures in {DATA_FILE}, not a measurement")


def stamp_figure(fig: Figure, results: Iterable[ResultDocument]) -> bool:
    """Draw the SIMULATED stamp on ``fig`` when any of ``results`` is simulated; True if drawn.

    A banner above the plots names the model, and a large diagonal mark crosses every axes, so a
    crop of any one chart keeps it.
    """
    text = stamp_text(labels_of(results))
    if text is None:
        return False
    names = ", ".join(labels_of(results))
    for ax in fig.get_axes():
        size = max(14.0, min(44.0, ax.get_position().width * fig.get_figwidth() * 7.0))
        for x, y, words, fontsize, weight, alpha in ((0.5, 0.52, "SIMULATED", size, "bold", 0.28),
                                                     (0.53, 0.36, f"stand-in model {names}", max(7.0, size / 4),
                                                      "normal", 0.5)):
            ax.text(x, y, words, fontsize=fontsize, fontweight=weight, alpha=alpha, transform=ax.transAxes,
                    rotation=20, ha="center", va="center", color="#cc0000", zorder=1000, gid=STAMP_GID, clip_on=False)
    fig.text(0.5, 0.995, text, ha="center", va="bottom", fontsize=9, fontweight="bold", color="white",
             bbox={"facecolor": "#cc0000", "edgecolor": "none", "pad": 3}, gid=STAMP_GID)
    return True
