"""The ``profile`` suite on the client (``gpuops profile``): the ranks' trace summaries made into
one per stage, the operator's sentence, its figures for ``results compare`` and ``results export``,
its table and its stacked bar per stage in the report. Pure.

A stage's figures are those of the lowest rank whose trace has it (every rank runs the same passes
in a TP group); each rank's wall and all-reduce time per pass stay beside them under ``ranks``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from gpuops.bench.frames import RemoteRun
from gpuops.bench.record import Headline, JSONObject, ResultDocument, Summary, at, mapping, number, objects
from gpuops.bench.report import figure_png, result_label
from gpuops.bench.simulated import is_simulated
from gpuops.bench.suite_base import across_repeats, merge_repeats, sim_cell, tool_runs, within_run
from gpuops.bench.suites import BenchTable, ExportLevel, Figures, ReportTable, RunParts, SuiteOptions
from gpuops.errors import GpuopsError
from gpuops.remote.kernel_groups import ALLREDUCE, GROUPS

__all__ = ["PLOTS", "across_repeats", "bench_tables", "check_options", "figures", "finish", "headline", "levels",
           "merge_repeats", "report_tables", "sentence", "summarize", "tool_runs", "within_run"]

# --stage -> the forward modes SGLang names its passes by (srt/model_executor/forward_batch_info.py)
# --stage -> the forward modes it reports and, first, the one its sentence is about; SGLang's names
# (srt/model_executor/forward_batch_info.py). "decode" is the decode phase: with speculative
# decoding its passes are the draft's and the target's verify (the field's ~30 ms pass).
EXTEND_MODES = ("EXTEND", "MIXED", "SPLIT_PREFILL", "DLLM_EXTEND")
LEADS = {"decode": ("TARGET_VERIFY", "DECODE"), "verify": ("TARGET_VERIFY",), "extend": EXTEND_MODES,
         "all": ("TARGET_VERIFY", "DECODE")}


def reported(stage: str, asked: str) -> bool:
    """Whether ``--stage asked`` reports the passes of forward mode ``stage``."""
    if asked == "all" or stage == "ALL":
        return True
    if asked == "verify":
        return stage == "TARGET_VERIFY"
    return (stage in EXTEND_MODES) == (asked == "extend")
_WORDS = {"DECODE": "decode", "TARGET_VERIFY": "verify", "EXTEND": "extend", "MIXED": "mixed extend",
          "DRAFT_EXTEND_V2": "draft extend", "ALL": "forward"}
GROUP_TITLES = {ALLREDUCE: "all-reduce", "collective": "other collectives", "gemm": "GEMM", "attention": "attention",
                "moe": "MoE", "norm_activation": "norm/activation", "sampling": "sampling", "memcpy": "memory copies",
                "other": "other"}


STAGES = ("decode", "verify", "extend", "all")
STEPS_MAX = 100


def check_options(options: SuiteOptions) -> None:
    if options.profile_stage not in STAGES:
        raise GpuopsError(f"profile: --stage {options.profile_stage!r} is not one of {', '.join(STAGES)}")
    if not 1 <= options.profile_steps <= STEPS_MAX:
        raise GpuopsError(f"profile: --steps must be 1 to {STEPS_MAX} (a trace grows with every step)")
    if options.tool:
        raise GpuopsError("profile: --tool sglang is for the decode and serving suites")


def stage_word(stage: str) -> str:
    return _WORDS.get(stage, stage.lower().replace("_", " "))


def _ranked_traces(run: RemoteRun) -> list[JSONObject]:
    def rank(record: Mapping[str, object]) -> int:
        value = at(record, "trace", "rank")
        return value if isinstance(value, int) else 1 << 30

    return sorted((r for r in run.profile if isinstance(r, dict)), key=rank)


def _allreduce(stage: Mapping[str, object]) -> Mapping[str, object]:
    return mapping(at(stage, "groups", ALLREDUCE))


def lead_stage(stages: Mapping[str, object], asked: str) -> str | None:
    """The stage the sentence is about: the asked one's, else decode's, else the first seen."""
    return next((s for s in LEADS.get(asked, ()) if s in stages), next(iter(stages), None))


def summarize(run: RemoteRun, options: SuiteOptions) -> RunParts:
    traces: list[JSONObject] = []
    stages: dict[str, JSONObject] = {}
    rank_rows: dict[str, list[JSONObject]] = {}
    errors: list[str] = []
    for record in _ranked_traces(run):
        trace = mapping(record.get("trace"))
        if record.get("error"):
            errors.append(str(record["error"]))
        traces.append({"file": record.get("file"), "bytes": record.get("bytes"), "rank": trace.get("rank"),
                       "error": record.get("error"), "passes_from": trace.get("passes_from"),
                       "step_spans": trace.get("step_spans"), "gpu_events": trace.get("gpu_events"),
                       "simulated": trace.get("simulated")})
        for name, stage in mapping(trace.get("stages")).items():
            row: JSONObject = {"rank": trace.get("rank"), "wall_ms": number(stage, "wall_ms", "median"),
                               "allreduce_ms_per_forward": number(stage, "groups", ALLREDUCE, "ms_per_forward")}
            if name not in stages:
                rank_rows[name] = []
                stages[name] = dict(mapping(stage), rank=trace.get("rank"), ranks=rank_rows[name])
            rank_rows[name].append(row)
    asked = options.profile_stage
    stages = {k: v for k, v in stages.items() if reported(k, asked)} or stages
    summary: Summary = {"steps": options.profile_steps, "stage_asked": asked,
                        "traces": traces, "stages": stages}
    summary["headline"] = _headline_of(stages, asked)
    return RunParts(summary, errors=errors)


def _headline_of(stages: Mapping[str, object], asked: str) -> JSONObject | None:
    name = lead_stage(stages, asked)
    if name is None:
        return None
    stage = mapping(stages[name])
    allreduce = _allreduce(stage)
    kinds = [c for c in objects(stage.get("collectives")) if c.get("group") == ALLREDUCE]
    return {"stage": name, "passes": stage.get("passes"), "wall_ms": number(stage, "wall_ms", "median"),
            "busy_ms": number(stage, "busy_ms", "median"), "idle_ms": number(stage, "idle_ms", "median"),
            "allreduce_calls_per_forward": allreduce.get("calls_per_forward"),
            "allreduce_ms_per_forward": allreduce.get("ms_per_forward"), "allreduce_share": allreduce.get("share"),
            "allreduce_kind": kinds[0].get("kind") if kinds else None}


def sentence(head: object, simulated: bool = False) -> str:
    """The line an operator needs: ``decode pass 30.1 ms: 122 all-reduce calls per decode pass,
    25.0 ms (83%), NCCL RING_LL``."""
    if not head or not isinstance(head, Mapping):
        return "no forward pass found in the traces"
    wall = head.get("wall_ms")
    text = f"{stage_word(str(head.get('stage')))} pass {_num(wall)} ms"
    calls = head.get("allreduce_calls_per_forward")
    if calls:
        share = head.get("allreduce_share")
        text += (f": {_count(calls)} all-reduce calls per {stage_word(str(head.get('stage')))} pass, "
                 f"{_num(head.get('allreduce_ms_per_forward'))} ms"
                 + (f" ({share * 100:.0f}%)" if isinstance(share, (int, float)) else "")
                 + (f", {head['allreduce_kind']}" if head.get("allreduce_kind") else ""))
    else:
        text += ": no all-reduce"
        idle = head.get("idle_ms")
        if isinstance(idle, (int, float)) and isinstance(wall, (int, float)) and wall:
            text += f"; GPU idle {_num(idle)} ms ({idle / wall * 100:.0f}%)"
    return text + (" [SIMULATED by the lab's stand-in]" if simulated else "")


def _num(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def _count(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def finish(run: RemoteRun, summary: Summary, rows: Sequence[JSONObject], errors: Sequence[str]) -> list[str]:
    if not summary.get("stages") and not errors:
        return ["no forward pass found in the traces (no GPU work inside the profiled steps)"]
    return []


def headline(summary: Summary, result: ResultDocument) -> Headline:
    head = summary.get("headline")
    return {"profile": head, "sentence": sentence(head, is_simulated(result)) if summary else None}


def figures(summary: Summary, result: ResultDocument) -> Figures:
    """Per stage: wall, GPU busy and idle per pass, and each group's time per pass; the
    all-reduce's calls and share too (``results compare`` of a profile before and after an apply)."""
    out: Figures = {}
    for name, stage in sorted(mapping(summary.get("stages")).items()):
        word = stage_word(name)
        out[(f"{word} pass wall p50", "ms", "lower")] = number(stage, "wall_ms", "median")
        out[(f"{word} GPU busy p50", "ms", "lower")] = number(stage, "busy_ms", "median")
        out[(f"{word} GPU idle p50", "ms", "lower")] = number(stage, "idle_ms", "median")
        out[(f"{word} all-reduce calls", "calls", "lower")] = number(stage, "groups", ALLREDUCE, "calls_per_forward")
        share = number(stage, "groups", ALLREDUCE, "share")
        out[(f"{word} all-reduce share", "%", "lower")] = None if share is None else round(share * 100, 2)
        for group in GROUPS:
            out[(f"{word} {GROUP_TITLES[group]}", "ms", "lower")] = number(stage, "groups", group, "ms_per_forward")
    return out


def levels(result: ResultDocument) -> list[ExportLevel]:
    """One export row per stage: its pass figures and each group's time per pass."""
    rows: list[ExportLevel] = []
    for name, stage in sorted(mapping((result.get("summary") or {}).get("stages")).items()):
        flat: JSONObject = {"passes": at(stage, "passes"), "wall_ms_p50": number(stage, "wall_ms", "median"),
                                "wall_ms_p90": number(stage, "wall_ms", "p90"),
                                "busy_ms_p50": number(stage, "busy_ms", "median"),
                                "idle_ms_p50": number(stage, "idle_ms", "median")}
        for group in GROUPS:
            flat[f"{group}_ms_per_forward"] = number(stage, "groups", group, "ms_per_forward")
            flat[f"{group}_calls_per_forward"] = number(stage, "groups", group, "calls_per_forward")
        rows.append(({"level": name}, flat))
    return rows


def bench_tables(hosts: Mapping[str, Headline]) -> list[BenchTable]:
    """One row per host: its sentence."""
    rows = []
    for name, line in hosts.items():
        rows.append([name, "yes" if line.get("ok") else "NO", line.get("sentence") or "-", line.get("result_id") or "-",
                     line.get("error") or ""])
    return [(None, ["host", "ok", "profile", "result", "error"], rows)]


def stage_table(stage: Mapping[str, object], simulated: bool) -> tuple[list[str], list[list[str]]]:
    """A stage's kernel groups: calls, ms and share per pass (idle last)."""
    rows = []
    for group in GROUPS:
        figures_ = mapping(at(stage, "groups", group))
        if not figures_:
            continue
        share = number(figures_, "share")
        rows.append([GROUP_TITLES[group], sim_cell(figures_.get("calls_per_forward"), simulated),
                     sim_cell(figures_.get("ms_per_forward"), simulated),
                     sim_cell(None if share is None else round(share * 100, 1), simulated)])
    idle = number(stage, "idle_ms", "median")
    wall = number(stage, "wall_ms", "median")
    if idle is not None:
        rows.append(["GPU idle", "", sim_cell(idle, simulated),
                     sim_cell(round(idle / wall * 100, 1) if wall else None, simulated)])
    return ["group", "calls/pass", "ms/pass", "% of pass"], rows


def report_tables(results: Sequence[ResultDocument]) -> list[ReportTable]:
    tables = []
    for result in results:
        for name, stage in sorted(mapping((result.get("summary") or {}).get("stages")).items()):
            headers, rows = stage_table(mapping(stage), is_simulated(result))
            title = (f"{result_label(result)}: {stage_word(name)} passes {at(stage, 'passes')}, wall "
                     f"{_num(number(stage, 'wall_ms', 'median'))} ms (p50)")
            tables.append(("Profile", title, headers, rows))
    return tables


def plot_stages(results: Sequence[ResultDocument]) -> bytes | None:
    """A stacked bar per result and stage: each kernel group's ms per pass, and the GPU idle time."""
    import matplotlib.pyplot as plt

    bars = []
    for result in results:
        for name, stage in sorted(mapping((result.get("summary") or {}).get("stages")).items()):
            parts = [(GROUP_TITLES[g], number(stage, "groups", g, "ms_per_forward") or 0.0) for g in GROUPS]
            parts.append(("GPU idle", number(stage, "idle_ms", "median") or 0.0))
            bars.append((f"{result_label(result)}\n{stage_word(name)}", parts, result))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(bars)), 4.2))
    colours = plt.get_cmap("tab10")
    for index, (title, _) in enumerate(bars[0][1]):
        values = [parts[index][1] for _, parts, _ in bars]
        bottoms = [sum(v for _, v in parts[:index]) for _, parts, _ in bars]
        ax.bar(range(len(bars)), values, bottom=bottoms, label=title,
               color="#cccccc" if title == "GPU idle" else colours(index % 10))
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([label for label, _, _ in bars], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("ms per forward pass")
    ax.set_title("Where a forward pass's time goes (per stage)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure_png(fig, [result for _, _, result in bars])


PLOTS = (("profile_stages", "Forward pass time by kernel group, per stage", plot_stages),)
