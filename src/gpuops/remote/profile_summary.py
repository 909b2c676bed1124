"""Where a forward pass's time goes, from one rank's trace of SGLang's profiler (on the host).

A pass is one ``step[<FORWARD_MODE> bs=N ...]`` span: SGLang 0.5.16 wraps every forward in a
``record_function`` of that name (``srt/utils/profile_utils.build_step_span_name``, called by
``ModelRunner.forward``), so a pass's stage is the release's own forward-mode name (EXTEND,
DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2, ...). Its GPU work is every kernel, copy and set whose
``correlation`` is that of a CUDA runtime call made on the span's thread inside the span (a CUDA
graph's kernels carry their ``cudaGraphLaunch``'s). A trace without step spans (0.5.8's;
0.5.16's when asked for GPU activity only) takes its stage from the file name's ``-<STAGE>``
suffix (``profile_by_stage``); a ``-DECODE`` file holds the steps asked for (SGLang's stage
counter stops there), cut apart at the widest GPU idle gaps; any other file is read as one pass.

Per pass: wall (first GPU start to last GPU end), GPU busy (the union of its GPU intervals), idle
(wall less busy: a launch-bound pass shows up here), and the time and calls of each kernel group
(``kernel_groups``). A stage's figures are the median and p90 over its passes; calls and times per
group are means per pass, and a share is of the mean wall.

Host code: stdlib only, Python 3.8+.
"""

import bisect
import os
import re

from gpuops.remote import kernel_groups, trace_stream
from gpuops.remote.bench_stats import percentile

EVENTS_MAX = 4000000  # events kept from one trace (a span, a runtime call or a GPU event each)
NAME_CHARS_MAX = 200
TOP_KERNELS = 12
_STEP = re.compile(r"^step\[([A-Z][A-Z0-9_]*)")
_FILE_STAGE = re.compile(r"-([A-Z][A-Z0-9_]*)\.trace\.json(?:\.gz)?$")
_FILE_RANK = re.compile(r"-TP-(\d+)")
_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
_CPU_COLLECTIVE = "gloo:"  # torch's ProcessGroupGloo names each collective's work "gloo:<coll>"


def clean(text, limit=NAME_CHARS_MAX):
    """A host's string as it may travel: printable, control characters as ``\\xNN``, bounded."""
    text = str(text)[:limit * 2]
    out = "".join(c if c.isprintable() else "\\x%02x" % ord(c) if ord(c) < 256 else "\\u%04x" % ord(c)
                  for c in text)
    return out if len(out) <= limit else out[:limit - 3] + "..."


def _number(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _Kept(object):
    """The compact events of one trace: step spans, runtime calls, GPU events (names interned)."""

    def __init__(self, limit):
        self.limit = limit
        self.count = 0
        self.spans = []      # (pid, tid, start, end, stage)
        self.launches = []   # (pid, tid, ts, correlation)
        self.gpu = []        # (correlation, start, end, name index)
        self.cpu_collectives = []  # (pid, start, end, name index): a CPU-only trace's collectives (gloo)
        self.names = {}      # cleaned name -> index
        self.kinds = []      # index -> (name, group, implementation)
        self.graph_launches = 0

    def keep(self, event):
        category = event.get("cat")
        name = event.get("name")
        if not isinstance(name, str) or category not in ("user_annotation",) + _RUNTIME_CATEGORIES + _GPU_CATEGORIES:
            return
        ts = _number(event.get("ts"))
        if ts is None:
            return
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if category == "user_annotation":
            found = _STEP.match(name)
            dur = _number(event.get("dur"))
            if found and dur is not None:
                self._add(self.spans, (str(event.get("pid")), str(event.get("tid")), ts, ts + dur, found.group(1)))
            elif name.startswith(_CPU_COLLECTIVE) and dur is not None and dur >= 0:
                # gloo runs a collective on its own threads, under this name: a CPU trace's "kernel"
                self._add(self.cpu_collectives, (str(event.get("pid")), ts, ts + dur,
                                                 self._name(clean(name), "cpu_collective")))
            return
        correlation = args.get("correlation")
        if not isinstance(correlation, int) or isinstance(correlation, bool):
            correlation = None
        if category in _RUNTIME_CATEGORIES:
            if correlation is not None:
                self._add(self.launches, (str(event.get("pid")), str(event.get("tid")), ts, correlation))
                if name.startswith("cudaGraphLaunch"):
                    self.graph_launches += 1
            return
        dur = _number(event.get("dur"))
        if dur is None or dur < 0:
            return
        self._add(self.gpu, (correlation, ts, ts + dur, self._name(clean(name), category)))

    def _add(self, where, item):
        self.count += 1
        if self.count > self.limit:
            raise trace_stream.TraceError("has more than %d events of interest (the limit): profile fewer steps"
                                          % self.limit)
        where.append(item)

    def _name(self, name, category):
        index = self.names.get(name)
        if index is None:
            group, how = kernel_groups.classify(name, category)
            index = self.names[name] = len(self.kinds)
            self.kinds.append((name, group, how))
        return index


def _pass_of_correlation(kept):
    """correlation -> the index of the span its runtime call was made in."""
    by_thread = {}
    for index, (pid, tid, start, end, _stage) in enumerate(kept.spans):
        by_thread.setdefault((pid, tid), []).append((start, end, index))
    for spans in by_thread.values():
        spans.sort()
    starts = {key: [s[0] for s in spans] for key, spans in by_thread.items()}
    owner = {}
    for pid, tid, ts, correlation in kept.launches:
        spans = by_thread.get((pid, tid))
        if not spans:
            continue
        at = bisect.bisect_right(starts[(pid, tid)], ts) - 1
        if at >= 0 and ts <= spans[at][1]:
            owner[correlation] = spans[at][2]
    return owner


def _busy(intervals):
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


class _Pass(object):
    def __init__(self, stage):
        self.stage = stage
        self.intervals = []
        self.by_kind = {}  # name index -> [calls, us]

    def add(self, start, end, kind):
        self.intervals.append((start, end))
        slot = self.by_kind.setdefault(kind, [0, 0.0])
        slot[0] += 1
        slot[1] += end - start

    def wall_us(self):
        return max(e for _, e in self.intervals) - min(s for s, _ in self.intervals) if self.intervals else 0.0


def _passes(kept, steps):
    """The passes of the trace and where their stages come from."""
    if kept.spans and not kept.gpu and kept.cpu_collectives:
        return _cpu_passes(kept), "step spans (CPU trace: its gloo collectives)", [s[3] - s[2] for s in kept.spans]
    if kept.spans:
        owner = _pass_of_correlation(kept)
        passes = [_Pass(stage) for (_p, _t, _s, _e, stage) in kept.spans]
        for correlation, start, end, kind in kept.gpu:
            index = owner.get(correlation)
            if index is not None:
                passes[index].add(start, end, kind)
        spans_cpu = [(s[3] - s[2]) for s in kept.spans]
        return [p for p in passes if p.intervals], "step spans", spans_cpu
    how = "GPU work split at its %d widest gaps" % (steps - 1) if steps > 1 else "GPU work as one pass"
    return _split_at_gaps(kept, steps), how + " (no step spans)", []


def _cpu_passes(kept):
    """A trace with no GPU work (a CPU backend): each collective gloo ran belongs to the step span
    of its process that it started in (a collective of gloo's completes inside the call)."""
    passes = [_Pass(stage) for (_p, _t, _s, _e, stage) in kept.spans]
    for pid, start, end, kind in kept.cpu_collectives:
        for index, (span_pid, _tid, begin, finish, _stage) in enumerate(kept.spans):
            if span_pid == pid and begin <= start <= finish:
                passes[index].add(start, end, kind)
                break
    return [p for p in passes if p.intervals]


def _split_at_gaps(kept, count):
    """``count`` passes from a trace without step spans: its GPU work cut at the ``count - 1`` widest
    idle gaps (between two passes the GPU waits for the scheduler: milliseconds; inside one, a
    CUDA graph's kernels follow each other within microseconds)."""
    ordered = sorted(kept.gpu, key=lambda g: g[1])
    if not ordered:
        return []
    gaps, reach = [], ordered[0][2]
    for index in range(1, len(ordered)):
        gaps.append((ordered[index][1] - reach, index))
        reach = max(reach, ordered[index][2])
    cuts = sorted(index for _gap, index in sorted(gaps, reverse=True)[:max(0, count - 1)])
    passes, begin = [], 0
    for cut in cuts + [len(ordered)]:
        one = _Pass(None)
        for _correlation, start, end, kind in ordered[begin:cut]:
            one.add(start, end, kind)
        passes.append(one)
        begin = cut
    return passes


def _ms(value):
    return None if value is None else round(value / 1000.0, 4)


def _stage_summary(kept, passes, cpu_us):
    """One stage's figures from its passes."""
    walls = [p.wall_us() for p in passes]
    busies = [_busy(p.intervals) for p in passes]
    idles = [w - b for w, b in zip(walls, busies)]
    count = float(len(passes))
    mean_wall = sum(p.wall_us() for p in passes) / count
    groups = {}
    hows = {}
    kernels = {}
    for one in passes:
        for kind, (calls, us) in one.by_kind.items():
            name, group, how = kept.kinds[kind]
            for table, key in ((groups, group), (hows, (group, how)), (kernels, kind)):
                if key is None or (table is hows and how is None):
                    continue
                slot = table.setdefault(key, [0, 0.0])
                slot[0] += calls
                slot[1] += us

    def figures(calls, us):
        return {"calls_per_forward": round(calls / count, 3), "ms_per_forward": _ms(us / count),
                "share": round(us / count / mean_wall, 4) if mean_wall else None}

    ranked = sorted(kernels.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]
    return {
        "passes": len(passes),
        "wall_ms": {"median": _ms(percentile(walls, 50)), "p90": _ms(percentile(walls, 90)), "mean": _ms(mean_wall)},
        "busy_ms": {"median": _ms(percentile(busies, 50)), "p90": _ms(percentile(busies, 90))},
        "idle_ms": {"median": _ms(percentile(idles, 50)), "p90": _ms(percentile(idles, 90))},
        "cpu_ms": {"median": _ms(percentile(cpu_us, 50))} if cpu_us else None,
        "groups": {g: figures(*groups[g]) for g in kernel_groups.GROUPS if g in groups},
        "collectives": [dict(figures(*v), group=k[0], kind=k[1]) for k, v in sorted(hows.items(), key=lambda i: -i[1][1])],
        "top_kernels": [dict(figures(*v), name=kept.kinds[k][0], group=kept.kinds[k][1]) for k, v in ranked],
    }


def file_rank(name):
    found = _FILE_RANK.search(name)
    return int(found.group(1)) if found else None


def file_stage(name):
    found = _FILE_STAGE.search(name)
    return found.group(1) if found and found.group(1) != "TP" and not found.group(1).isdigit() else None


def summarize_trace(path, steps=1, limits=None):
    """The summary of one trace file: its name, size, rank, events and per-stage figures; raises
    ``trace_stream.TraceError`` (one line) when it cannot be read."""
    limits = dict(limits or {})
    header = {}
    kept = _Kept(int(limits.pop("events", EVENTS_MAX)))
    for event in trace_stream.events(path, header, **limits):
        kept.keep(event)
    name = os.path.basename(path)
    # without spans, a by-stage DECODE file holds the steps asked for (SGLang's own stage counter);
    # any other file as many passes as ran, which the trace does not say: read as one
    count = max(1, int(steps)) if file_stage(name) == "DECODE" else 1
    passes, passes_from, cpu_us = _passes(kept, count)
    stages = {}
    if kept.spans:
        for stage in sorted(set(p.stage for p in passes)):
            mine = [p for p in passes if p.stage == stage]
            stages[stage] = _stage_summary(kept, mine, [c for c, s in zip(cpu_us, kept.spans) if s[4] == stage])
    elif passes:
        stages[file_stage(name) or "ALL"] = _stage_summary(kept, passes, [])
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    return {"file": clean(name), "bytes": size, "rank": file_rank(name), "file_stage": file_stage(name),
            "events_kept": kept.count, "gpu_events": len(kept.gpu), "step_spans": len(kept.spans),
            "graph_launches": kept.graph_launches, "passes_from": passes_from,
            "simulated": bool(header.get("gpuops_simulated")), "stages": stages}
