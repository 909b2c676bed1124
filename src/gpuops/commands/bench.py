"""`gpuops bench`, `gpuops results list|show|compare`, `gpuops report` (thin: parse, call, render).

``gpuops bench --json`` prints::

    {"schema": 1, "suite": ..., "results_dir": ...,
     "hosts": {NAME: {"ok", "suite", "partial", "output_tokens_per_s", "ttft_ms" (p50),
                      "itl_ms": {"p50", "p90", "p99"}, "accept_length", "result_id", "result_file",
                      "fingerprint", "simulated", "speed_model" (the stand-in model's label, else null), "error",
                      "levels" (serving), "best_variant"/"step_cost_ms"/"variants" (allreduce),
                      "peak_*" (serving), "fused_us"/"unfused_us"/"*_step_ms"/"all_correct" (fusion)}}}

Full result and comparison schema: src/gpuops/bench/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypedDict

import click
from click.core import ParameterSource

from gpuops.bench.suites import COMMON_OPTIONS, SUITES, Suite
from gpuops.bench.suites import suite as suite_spec
from gpuops.commands.bench_options import BENCH_OPTIONS, bench_options, results_dir_option
from gpuops import time_limits
from gpuops.commands.options import guide, inventory_options
from gpuops.errors import GpuopsError
from gpuops.bench import options as opt
from gpuops.bench.compare import compare_results, format_delta, format_value
from gpuops.bench.export import rows as export_rows, to_csv, to_jsonl, to_prometheus
from gpuops.bench.report import write_report
from gpuops.bench.record import Headline, ResultDocument, at, mapping, objects
from gpuops.bench.results import headline
from gpuops.bench.runner import HostBench, eta_s, run_bench, targets_for
from gpuops.bench.server_metrics import metrics_line
from gpuops.bench.simulated import figure_basis, footnote, mark, model_label, stamp_text, verdict
from gpuops.bench.store import ResultsStore
from gpuops.bench.suite_base import cell, sim_cell
from gpuops.bench.suites import reader
from gpuops.inventory import load_inventory, local_inventory
from gpuops.output import format_table, is_tty, make_console, print_json, rich_table, safe_text
from gpuops.transport import ConnectOptions

if TYPE_CHECKING:
    from gpuops.bench.store import ResultEntry, ResultsStore

EXIT_SOME_HOST_FAILED = 1


class BenchJSON(TypedDict):
    """``gpuops bench --json`` (schema 1; keys are only ever added): one headline per host."""

    schema: int
    suite: str
    results_dir: str
    hosts: dict[str, Headline]


@click.group("bench", invoke_without_command=True, epilog=guide("bench-and-results.md"))
@click.pass_context
@inventory_options
@click.option("--suite", type=click.Choice(list(SUITES)),
              help="The suite, for the one-command form (same as `gpuops bench SUITE`, which lists only its options).")
@bench_options()
def bench(ctx: click.Context, suite: str | None, **params: Any) -> None:
    """Benchmark on the host, next to its SGLang server, and bring the results home.

    \b
    gpuops bench decode --remote -i inv.yml
    gpuops bench serving --remote --concurrency 1,4,16
    gpuops bench allreduce --remote --env NCCL_ALGO=Ring,Tree --env NCCL_PROTO=LL,LL128,Simple
    gpuops bench decode --url http://127.0.0.1:30000      (here, against a local server)
    gpuops bench --suite decode ...                       (the same, every option in one command)
    """

    if ctx.invoked_subcommand is not None:
        given = [p.opts[-1] for p in ctx.command.params
                 if ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None)]
        if given:
            raise GpuopsError(f"bench: {', '.join(given)} go after the suite: gpuops bench "
                              f"{ctx.invoked_subcommand} {' '.join(given)} ...")
        return
    if suite is None:
        raise GpuopsError(f"bench: name a suite: gpuops bench {'|'.join(SUITES)} (or --suite)")
    _run_bench(suite, params)


def _suite_command(spec: Suite) -> click.Command:
    @click.command(spec.name, help=spec.help)
    @inventory_options
    @bench_options(COMMON_OPTIONS + spec.options)
    def command(**params: Any) -> None:
        _run_bench(spec.name, params)

    return command


for _spec in SUITES.values():
    bench.add_command(_suite_command(_spec))


_RUN_PARAMS = ("remote", "inventory", "limit", "as_json", "results_dir", "url", "port", "api", "input_len",
               "output_len", "num_requests", "warmup", "seed", "concurrency", "requests_per_level", "repeat",
               "request_rate", "max_concurrency", "slo", "dataset", "dataset_path", "random_range_ratio",
               "request_timeout", "tool", "tool_args", "python", "world_size", "hidden_size", "tokens",
               "variant_timeout", "dtype", "env_specs", "cuda_graph", "backend", "kernel", "iters", "trials",
               "allreduces_per_step", "accept_new_host_keys", "known_hosts", "timeout", "connect_timeout")


def _option_defaults() -> dict[str, Any]:
    """Every bench option's default, as click would pass it (for the options a suite does not take)."""
    names = {name for name, _ in BENCH_OPTIONS}
    with bench.make_context("bench", []) as ctx:  # parses an empty command line: defaults only
        return {name: value for name, value in ctx.params.items() if name in names}


def _run_bench(suite: str, given: dict[str, Any]) -> None:
    """One bench run; options the suite's command does not take have their defaults."""
    params = {**_option_defaults(), **given}
    (remote, inventory, limit, as_json, results_dir, url, port, api, input_len, output_len, num_requests,
     warmup, seed, concurrency, requests_per_level, repeat, request_rate, max_concurrency, slo, dataset,
     dataset_path, random_range_ratio, request_timeout, tool, tool_args, python, world_size, hidden_size,
     tokens, variant_timeout, dtype, env_specs, cuda_graph, backend, kernel, iters, trials, allreduces_per_step,
     accept_new_host_keys, known_hosts, timeout, connect_timeout) = (params[n] for n in _RUN_PARAMS)

    if url and remote:
        raise GpuopsError("bench: --url is for a local run; with --remote the client uses the host's loopback")
    if not remote and (inventory or limit):
        raise GpuopsError("bench: -i/-l select hosts for --remote; add --remote")
    options = opt.BenchOptions(
        suite=suite, api=api, input_len=input_len, output_len=output_len, num_requests=num_requests,
        warmup=warmup, concurrency=opt.parse_int_list(concurrency, "--concurrency"),
        requests_per_level=requests_per_level, seed=seed, request_timeout_s=request_timeout, tool=tool, repeat=repeat,
        request_rates=opt.parse_rates(request_rate), max_concurrency=max_concurrency, slo=opt.parse_slo(slo),
        dataset=dataset, dataset_path=dataset_path, random_range_ratio=random_range_ratio,
        tool_args=opt.parse_tool_args(tool_args), python=python,
        allreduce=opt.AllreduceOptions(
            world_size=world_size, hidden_size=hidden_size,
            tokens=opt.parse_int_list(tokens, "--tokens") if tokens else
            suite_spec(suite).default_tokens,
            timeout_s=variant_timeout,
            dtype=opt.check_dtype(dtype), env_variants=opt.expand_env_variants(env_specs), cuda_graph=cuda_graph,
            backend=backend, kernels=opt.check_kernels(kernel), iters=iters, trials=trials, allreduces_per_step=allreduces_per_step),
    )
    if url:
        _check_url(url)
    hosts = load_inventory(inventory).select(limit) if remote else local_inventory().select(None)
    targets = targets_for(hosts, port, url, remote)
    timeout = time_limits.per_host("bench", timeout)
    connect_options = ConnectOptions(accept_new_host_keys=accept_new_host_keys, known_hosts_files=tuple(known_hosts),
                                     connect_timeout=min(connect_timeout, timeout))
    store = ResultsStore(results_dir)
    progress = None if as_json else _Progress(suite, repeat)
    try:
        states = run_bench(targets, options, store, connect_options, remote=remote,
                           on_change=progress.update if progress else None, timeout=timeout)
    finally:
        if progress:
            progress.close()
    _say_store(store)  # a figure stored as missing, an index not updated: one line each
    document: BenchJSON = {"schema": 1, "suite": suite, "results_dir": str(Path(results_dir)), "hosts": {}}

    for name, state in states.items():
        line = headline(state.result or {"suite": suite})
        line["result_file"] = str(state.file) if state.file else None
        if state.file is None:
            line["result_id"] = None
        line["error"] = state.error
        line["ok"] = bool(line.get("ok")) and state.error is None
        document["hosts"][name] = line
    if as_json:
        print_json(document)
    else:
        _render_bench(document)
    sys.exit(0 if all(h.get("ok") for h in document["hosts"].values()) else EXIT_SOME_HOST_FAILED)


def _check_url(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise GpuopsError(f"bench: --url {url!r} is not http://HOST:PORT")


class _Progress:
    """Live progress on a terminal (stderr): per host its status, requests or measurements done of
    the total, the current level or variant, and an ETA; elsewhere plain lines at most every 15 s."""

    PLAIN_EVERY_S = 15.0

    def __init__(self, suite: str, repeat: int = 1) -> None:
        self.live = None
        self.suite = suite
        self.repeat = repeat
        self.last_plain = 0.0
        self.last_statuses: dict[str, tuple[str, str, bool]] = {}
        self.tty = is_tty(sys.stderr)
        if self.tty:
            from rich.live import Live

            self.live = Live(console=make_console(sys.stderr), refresh_per_second=4, transient=True)
            self.live.start()

    def rows(self, states: Mapping[str, HostBench]) -> list[list[str]]:
        rows = []
        for name, state in states.items():
            progress = (state.progress or {}) if state.status in ("running", "stopping") else {}
            done, total = progress.get("done"), progress.get("total")
            count = f"{done}/{total}" if total else (str(done) if done is not None else "")
            if self.repeat > 1 and state.repeat:
                count += f" (repeat {state.repeat}/{self.repeat})"
            eta = eta_s(state, self.repeat) if state.status == "running" else None
            rows.append([name, state.status, count, str(progress.get("stage") or ""),
                         f"{eta:.0f} s" if eta is not None else "", state.error or ""])
        return rows

    def update(self, states: Mapping[str, HostBench]) -> None:
        import time

        rows = self.rows(states)
        if self.live is not None:
            self.live.update(rich_table(["host", self.suite, "done", "now", "ETA", "note"], rows,
                                        title="benchmarking (Ctrl-C stops and keeps what was measured)"))
            return
        # a line when a host's status, stage or ETA-availability changes, else every PLAIN_EVERY_S
        statuses = {row[0]: (row[1], row[3], bool(row[4])) for row in rows}
        now = time.monotonic()
        if statuses == self.last_statuses and now - self.last_plain < self.PLAIN_EVERY_S:
            return
        self.last_statuses, self.last_plain = statuses, now
        for name, status, count, stage, eta, note in rows:
            bits = [b for b in (count and f"{count} done", stage, eta and f"ETA {eta}", note) if b]
            click.echo(f"bench {self.suite}: {name} {status}" + (f": {', '.join(bits)}" if bits else ""), err=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _fmt(value: object) -> str:
    return cell(value)


# Summary keys that count requests or tokens: exact even from a stand-in, so never marked (sim).
_EXACT_COUNTS = frozenset({"requests", "completed", "failed", "output_tokens", "input_tokens", "levels",
                           "world_size", "hidden_size", "allreduces_per_step", "ranked_at_tokens"})


def _fmt_sim(value: object, simulated: bool) -> str:
    """A figure, marked (sim) when it comes from a stand-in server (gpuops.bench.simulated)."""

    return sim_cell(value, simulated)


# What a stored document that passed the store's checks (bench/result_file.py) can still raise in
# a reader, at a field no check names: one line naming the file, never a traceback.
_READ_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError)


def _unread_line(name: str, command: str, exc: Exception) -> str:
    return f"results: {name}: {command} cannot read it ({type(exc).__name__}: {exc})"


def _read_one(store: ResultsStore, wanted: str) -> tuple[str, ResultDocument]:
    """(file name, document) of the result ``wanted`` names (GpuopsError, one line, if none)."""
    entry = store.resolve(wanted)
    return entry.file, store.read(entry.file).document


def _documents(store: ResultsStore, wanted: tuple[str, ...]) -> list[tuple[str, ResultDocument]]:
    """(file name, document) of each result named, or of every readable one when none is: a file
    that stops reading between the listing and the read is then left out with its line."""
    if wanted:
        return [_read_one(store, w) for w in wanted]
    out = []
    for entry in store.entries():
        try:
            out.append((entry.file, store.read(entry.file).document))
        except GpuopsError as exc:
            store.notes[f"{exc}; left out"] = None
    return out


def _say_store(store: ResultsStore, listed: bool = False, flagged: list[ResultEntry] | None = None) -> None:
    """On stderr, one line each: the files that are not results gpuops can read (when the command
    went through the whole folder), what the store did on the way (an index rebuilt, figures read
    as missing)."""
    lines = [b.line() for b in store.bad.values()] if listed else []
    lines += [f"results: {e.file}: {e.flagged}" for e in flagged or () if e.flagged]
    for line in lines + [n for n in store.notes if n not in lines]:
        click.echo(line, err=True)
    store.notes.clear()


def _sim_footnote(labels: list[str]) -> None:
    line = footnote(sorted(set(labels)))
    if line:
        click.echo(line)


def _render_bench(document: BenchJSON) -> None:
    """The per-host tables of ``gpuops bench``: each suite's own (``bench_tables`` of its client module)."""

    hosts = document["hosts"]
    suite = document["suite"]
    console = make_console()
    for index, (title, headers, rows) in enumerate(reader(suite).bench_tables(hosts)):
        if index and not rows:
            continue  # a further table (the serving sweep) only when it has rows
        if is_tty():
            console.print(rich_table(headers, rows, title=title or f"bench {suite}"))
        else:
            if index:
                click.echo()
            click.echo(format_table(headers, rows))
    _sim_footnote([line.get("speed_model") or "unrecorded" for line in hosts.values() if line.get("simulated")])

    for name, line in hosts.items():
        said = metrics_line(line.get("server_metrics"))
        if said:
            click.echo(f"{name}: server /metrics over the run: {said}")
        speculative = mapping(line.get("speculative"))
        if speculative.get("in_effect") or speculative.get("disagreements"):
            click.echo(f"{name}: speculative decoding {speculative['reason']}")
    saved = [file for file in (line.get("result_file") for line in hosts.values()) if file]
    if saved:
        click.echo(f"results: {', '.join(saved)}")


# --------------------------------------------------------------------------- results

@click.group("results", epilog=guide("bench-and-results.md"))
def results() -> None:
    """List, show and compare stored benchmark results."""


@results.command("list")
@results_dir_option
@click.option("--json", "as_json", is_flag=True)
def results_list(results_dir: str, as_json: bool) -> None:
    """Every stored result, oldest first."""

    store = ResultsStore(results_dir)
    entries = store.entries()
    _say_store(store, listed=True, flagged=entries)
    if as_json:
        print_json({"schema": 1, "results": [e.as_dict() for e in entries],
                    "skipped": [{"file": b.name, "why": b.why} for b in store.bad.values()]})
        return
    if not entries:
        click.echo(f"no results in {results_dir}")
        return
    rows = [[e.id, e.created, e.host, e.suite + (f" ({e.tool})" if e.tool else ""),
             "yes" if e.ok else ("partial" if e.partial else "NO"), _fmt_sim(e.output_tokens_per_s, e.simulated),
             _fmt_sim(e.ttft_ms_p50, e.simulated), _fmt_sim(e.itl_ms_p50, e.simulated), (e.fingerprint or "")[:10],
             e.sglang_version or "-"]
            for e in entries]
    click.echo(format_table(["id", "created", "host", "suite", "ok", "tok/s", "TTFT p50", "ITL p50",
                             "config", "sglang"], rows))
    _sim_footnote([e.speed_model or "unrecorded" for e in entries if e.simulated])


@results.command("show")
@click.argument("result_id")
@results_dir_option
@click.option("--json", "as_json", is_flag=True, help="The whole stored document.")
def results_show(result_id: str, results_dir: str, as_json: bool) -> None:
    """One result: configuration, summary and where its raw samples are."""

    store = ResultsStore(results_dir)
    name, result = _read_one(store, result_id)
    _say_store(store)
    if as_json:
        print_json(result)
        return
    lines: list[str] = []
    try:
        _show_lines(result, lines.append)
    except _READ_ERRORS as exc:
        raise GpuopsError(_unread_line(name, "results show", exc)) from None
    for line in lines:
        click.echo(line)


def _show_lines(result: ResultDocument, say: Callable[[str], None]) -> None:
    """``results show``'s text of one stored result, a line at a time, to ``say``."""
    server = result.get("server") or {}
    config = result.get("configuration") or {}
    summary = result.get("summary") or {}

    sim_label = model_label(result)
    sim = sim_label is not None
    say(f"result {result['id']}  host {result.get('host')}  suite {result.get('suite')}  "
        f"created {result.get('created')}  {'ok' if result.get('ok') else 'NOT ok'}"
        f"{'  (partial)' if result.get('partial') else ''}")
    if sim:
        model = server.get("speed_model") or {}
        say(f"{stamp_text([str(sim_label)])}: every figure marked (sim) is the model's prediction, not a "
            f"measurement ({model.get('shape_reason') or 'shape not recorded'}; figures and their sources "
            f"in gpuops/lab/speed_model.json)")

        for figure in model.get("figures") or []:
            value = figure.get("value")
            shown = format_value(value) if isinstance(value, float) else str(value)
            say(f"  model input {figure.get('name')} = {shown} {figure.get('unit', '')}: "
                f"{figure_basis(figure)}, source {figure.get('source')}")
    say(f"server  {server.get('url')}  model {server.get('model_path')}  sglang {server.get('version')}")
    say(f"config  fingerprint {result.get('fingerprint')}")
    for key, value in (config.get("server_args") or {}).items():
        if value not in (None, False):
            say(f"  --{key.replace('_', '-')} {value}")
    for key, value in (config.get("env") or {}).items():
        say(f"  {key}={value}")
    for gate in config.get("patched_gates") or []:
        say(f"  patched: {gate}")
    say("summary")
    for key, value in summary.items():
        if key == "variants":
            for v in objects(value):
                latency = mapping(v.get("latency_us"))
                say(f"  {v.get('label')}: " + (", ".join(f"{k} tok {_fmt_sim(x, sim)} us" for k, x in latency.items())
                                               if v.get("ok") else f"FAILED {v.get('error')}"))
        elif isinstance(value, dict):
            say(f"  {key}: " + ", ".join(f"{k} {_fmt_sim(x, sim)}" for k, x in value.items()))
        else:
            timed = isinstance(value, (int, float)) and key not in _EXACT_COUNTS
            say(f"  {key}: {_fmt_sim(value, sim) if timed else _fmt(value)}")
    for level in result.get("levels") or []:
        say(f"  c={level.get('concurrency')}: {_fmt_sim(level.get('total_output_tokens_per_s'), sim)} tok/s total, "
            f"{_fmt_sim(level.get('request_throughput'), sim)} req/s, "
            f"TTFT p50 {_fmt_sim(at(level, 'ttft_ms', 'p50'), sim)} ms, "
            f"ITL p50 {_fmt_sim(at(level, 'itl_ms', 'p50'), sim)} ms")
    for error in result.get("errors") or []:
        say(f"error: {error}")
    say(f"raw samples: {len(result.get('samples') or [])} (gpuops results show {result['id']} --json)")


@results.command("compare")
@click.argument("result_ids", nargs=-1, required=True)
@results_dir_option
@click.option("--json", "as_json", is_flag=True)
def results_compare(result_ids: tuple[str, ...], results_dir: str, as_json: bool) -> None:
    """Key figures side by side (deltas against the first) and how the configurations differ."""

    if len(result_ids) < 2:
        raise GpuopsError("results compare: give at least two result ids")
    store = ResultsStore(results_dir)
    named = [_read_one(store, i) for i in result_ids]
    _say_store(store)
    try:
        comparison = compare_results([doc for _, doc in named])
    except _READ_ERRORS as exc:
        # Which one: each compared with itself runs every reader on it alone.
        for name, doc in named:
            try:
                compare_results([doc, doc])
            except _READ_ERRORS as own:
                raise GpuopsError(_unread_line(name, "results compare", own)) from None
        raise GpuopsError(f"results compare: cannot compare these results ({type(exc).__name__}: {exc})") from None
    if as_json:
        print_json({"schema": 1, **comparison.as_json()})
        return

    sims = [label is not None for label in comparison.simulated]
    headers = ["metric"] + [mark(f"{h} {i}", s) for h, i, s in zip(comparison.hosts, comparison.ids, sims)]
    rows = []
    for metric in comparison.metrics:
        cells = [f"{metric.name} ({metric.unit})"]
        for index, (value, delta, better) in enumerate(zip(metric.values, metric.deltas_pct(), metric.improved())):
            word = verdict(better, comparison.column_simulated(index))
            if index and better is None and delta is not None and abs(delta) >= 1e-9:
                word = "within noise" if metric.interval(0) and metric.interval(index) else "no interval"
            cells.append(" ".join(p for p in (mark(format_value(value), sims[index]), format_delta(delta), word) if p))
        rows.append(cells)
    click.echo(format_table(headers, rows))
    click.echo("a difference counts only where the 95% bootstrap intervals do not overlap, else: within noise "
               "(--json has the intervals)")
    _sim_footnote([label for label in comparison.simulated if label])
    click.echo()
    if comparison.same_configuration:
        click.echo(f"same configuration (fingerprint {comparison.fingerprints[0]})")
        return
    for diff in comparison.config_diffs:
        if not diff["differences"]:
            click.echo(f"{diff['id']}: same configuration as {diff['against']}")
            continue
        click.echo(f"{diff['id']} differs from {diff['against']}:")
        for d in diff["differences"]:
            click.echo(f"  {d['section']} {d['key']}: {shown_setting(d['a'])} -> {shown_setting(d['b'])}")


def shown_setting(value: object) -> str:
    """A configuration value as `results compare` prints it: a setting one run lacks is "(unset)",
    never Python's "None" (an operator reads "None" as a value someone set)."""
    return "(unset)" if value is None else repr(value)


@results.command("export")
@click.argument("result_ids", nargs=-1)
@results_dir_option
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "prometheus"]), default="csv", show_default=True,
              help="csv/jsonl: one row per result x level (pandas.read_csv / read_json(lines=True)); "
                   "prometheus: text exposition format (a node_exporter textfile).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here (default: stdout).")
def results_export(result_ids: tuple[str, ...], results_dir: str, fmt: str, output: str | None) -> None:
    """Stored results (default: all) as flat rows, with the configuration flattened into columns."""

    store = ResultsStore(results_dir)
    table = []
    ids = []
    for name, doc in _documents(store, result_ids):
        try:
            table.extend(export_rows([doc]))  # one result at a time: one that cannot be read is named
        except _READ_ERRORS as exc:
            if result_ids:
                raise GpuopsError(_unread_line(name, "results export", exc)) from None
            store.notes[_unread_line(name, "results export", exc) + "; left out"] = None
            continue
        ids.append(name)
    _say_store(store, listed=not result_ids)
    if not ids:
        raise GpuopsError(f"results export: no results in {results_dir}")
    text = {"csv": to_csv, "jsonl": to_jsonl, "prometheus": to_prometheus}[fmt](table)
    if output:
        # a text file is read with cat and less too: host text in csv/prometheus cells is shown
        # escaped; jsonl keeps every value (json.dumps encodes the controls)
        Path(output).write_text(text if fmt == "jsonl" else safe_text(text), encoding="utf-8")
        click.echo(f"wrote {output} ({len(table)} rows from {len(ids)} results)", err=True)
    else:
        click.echo(text, nl=False)


@click.command("report", epilog=guide("bench-and-results.md"))
@click.argument("result_ids", nargs=-1)
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default="report.html", show_default=True,
              help="The HTML file; a Markdown summary is written next to it (.md).")
@results_dir_option
def report(result_ids: tuple[str, ...], output: str, results_dir: str) -> None:
    """Write a self-contained HTML report (plots embedded) of the given results (default: all)."""

    store = ResultsStore(results_dir)
    named = _documents(store, result_ids)
    if not named:
        _say_store(store, listed=True)
        raise GpuopsError(f"report: no results in {results_dir}")
    try:
        html_path, md_path = write_report([doc for _, doc in named], Path(output))
    except _READ_ERRORS as exc:
        # Which ones: the report of each alone (only now: plots cost a second or so each).
        kept = []
        for name, doc in named:
            try:
                write_report([doc], Path(output))
            except _READ_ERRORS as own:
                if result_ids:
                    raise GpuopsError(_unread_line(name, "report", own)) from None
                store.notes[_unread_line(name, "report", own) + "; left out"] = None
                continue
            kept.append((name, doc))
        if len(kept) == len(named):
            raise GpuopsError(f"report: cannot report these results together ({type(exc).__name__}: {exc})") from None
        if not kept:
            _say_store(store, listed=True)
            raise GpuopsError(f"report: no result in {results_dir} could be read") from None
        named = kept
        html_path, md_path = write_report([doc for _, doc in named], Path(output))
    _say_store(store, listed=not result_ids)
    click.echo(f"wrote {html_path} and {md_path} ({len(named)} results)")
