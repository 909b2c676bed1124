"""Pack every probe a command needs into ONE remote script; split its framed output locally.

A probe is a pair, as in pyinfra's facts: the shell text to run on the host and a pure
``parse(ProbeOutput) -> value``. Running nine probes as nine SSH channels costs seconds on
loopback; packed into one exec it costs one round trip.

Framing: each probe's stdout and stderr are printed between marker lines that carry a random
nonce, so nothing a probe prints (a file's content, a hostile process name) can forge a frame.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpuops.transport.limits import MiB, over_message
from gpuops import timings
from gpuops.errors import TransportError
from gpuops.transport.become import become_connection
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.transport.base import Connection

T = TypeVar("T")
# A probe of a narrower value is a probe of a wider one (its parser only gives): a list of probes of
# different facts is ``list[Probe[object]]``.
T_co = TypeVar("T_co", covariant=True)

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


# What one probe may print (its stdout) unless it declares more (``Probe.output_limit``): the host
# cuts it one byte past the limit, so a runaway probe (a replaced nvidia-smi printing 300 MB) fails
# its own fact ("output over 4 MiB") and the others still parse. The whole exec is bounded too
# (``transport.limits.EXEC_OUTPUT_LIMIT``). stderr is cut at the same limit (only its tail is read).
PROBE_OUTPUT_LIMIT = 4 * MiB
LARGE_PROBE_OUTPUT_LIMIT = 32 * MiB  # declared by the gate scan, the journal and apply's file contents


@frozen
class ProbeOutput:
    """What one probe printed on the host, cut out of the gather's framed output: stdout, stderr, exit status."""

    stdout: str
    stderr: str
    exit_status: int
    kept: bool = False  # a ``kept`` frame: the host skipped the probe (its ``unless`` held)
    size: int = field(default=-1, compare=False)  # bytes of stdout as the host sent them (-1: not counted)


@frozen
class Probe(Generic[T_co]):
    """One fact to gather, as in pyinfra: the sh text run on the host and the pure parser of what it prints;
    packed with the others into one remote script."""

    name: str  # unique key, e.g. "gpu.query"
    script: str  # POSIX sh; may use "$GPUOPS_PY" (set by the preamble)
    parse: Callable[[ProbeOutput], T_co]  # pure
    # sh text started in the background before the probes run (its output goes to files under
    # "$gpuops_tmp" that ``script`` then prints). Slow, independent commands (each nvidia-smi call
    # initialises NVML) thus cost the slowest one, not their sum; the gather waits for every start
    # just before the first probe that has one.
    start: str = ""
    # sh text run in the script's own shell after the preamble, before any ``start`` (so it can set
    # variables that ``unless`` tests); the same text given by several probes runs once.
    setup: str = ""
    # A sh condition: when it holds on the host, neither ``start`` nor ``script`` runs and the probe's
    # value is ``ProbeKept`` (the caller already holds what it would say: apply/kept_facts.py).
    unless: str = ""
    # The most stdout this probe may print (bytes); more fails this probe only. Declared larger by
    # the probes whose answers are big by nature (the gate scan's report, the journal, file contents).
    output_limit: int = PROBE_OUTPUT_LIMIT


def background_output(name: str) -> str:
    """sh text that prints what probe ``name``'s ``start`` wrote to "$gpuops_tmp/NAME.{out,err,rc}",
    with its exit status as its own (none written: the start was killed before it ended, so 1)."""
    files = f'"$gpuops_tmp/{name}'
    return (f"cat {files}.out\" 2>/dev/null; cat {files}.err\" >&2 2>/dev/null; "
            f"gpuops_s=$(cat {files}.rc\" 2>/dev/null); exit \"${{gpuops_s:-1}}\"")


def in_background(probe: Probe[T]) -> Probe[T]:
    """``probe`` started with the exec, beside the probes framed before it, and framed where it
    stands in the list: a slow probe that reads nothing the others write then costs the wall time of
    the slowest, not the sum (on a host with a core to spare)."""
    files = f'"$gpuops_tmp/{probe.name}'
    start = f"(\n{probe.script}\n) >{files}.out\" 2>{files}.err\"\necho $? >{files}.rc\""
    return replace(probe, start=start, script=background_output(probe.name))


@frozen
class ProbeKept:
    """A probe skipped on the host because its ``unless`` held: the caller keeps its answer."""

    name: str


@frozen
class ProbeFailure:
    """A probe whose output never came back (the script died before it) or whose parser failed."""

    name: str
    reason: str
    known: bool = False


def missing_reason(values: Mapping[str, Any], name: str) -> str:
    """Why probe ``name`` has no value: its failure's reason, else that it never ran."""
    value = values.get(name)
    return value.reason if isinstance(value, ProbeFailure) else f"probe {name} did not run"


def value_or_unknown(values: Mapping[str, Any], name: str, expected: type[T], unknown: Callable[[str], T]) -> T:
    """Probe ``name``'s parsed value when it is an ``expected``, else ``unknown(why it is missing)``."""
    value = values.get(name)
    return value if isinstance(value, expected) else unknown(missing_reason(values, name))


# The output of a probe the host skipped (a ``kept`` frame); ``parse_outputs`` turns it into ``ProbeKept``.
KEPT = ProbeOutput("", "", 0, kept=True)


def new_nonce() -> str:
    return secrets.token_hex(8)


def _check_names(probes: Iterable[Probe[Any]]) -> None:
    seen: set[str] = set()
    for probe in probes:
        if not _NAME_RE.match(probe.name):
            raise ValueError(f"probe name {probe.name!r} must be letters, digits and ._:-")
        if probe.name in seen:
            raise ValueError(f"probe {probe.name!r} given twice")
        seen.add(probe.name)


def build_gather_script(probes: Iterable[Probe[Any]], nonce: str, preamble: str = "") -> str:
    """One POSIX sh script that runs every probe and frames its stdout, stderr and exit status.

    Each probe runs in a subshell with stdin from /dev/null: the script itself arrives on stdin
    (``sh -s``), and a probe that reads stdin must not eat the rest of it.
    """
    probes = list(probes)
    _check_names(probes)
    mark = f"@@gpuops:{nonce}"
    parts = [
        "# gpuops gather: generated, one exec per host",
        "LC_ALL=C; export LC_ALL",
        'gpuops_tmp=$(mktemp -d 2>/dev/null || { d="${TMPDIR:-/tmp}/gpuops.$$"; mkdir -m 700 "$d" && echo "$d"; })',
        "trap 'rm -rf \"$gpuops_tmp\"' EXIT",
        preamble,
    ]
    for setup in dict.fromkeys(probe.setup for probe in probes if probe.setup):  # each once, in order
        parts.append(setup)
    started = [probe for probe in probes if probe.start]
    for probe in started:
        start = f"(\n{probe.start}\n) </dev/null >/dev/null 2>&1 &\ngpuops_bg=\"${{gpuops_bg:-}} $!\""
        parts.append(_unless(probe, start, ":"))
    for probe in probes:
        if started and probe is started[0]:
            parts.append("wait $gpuops_bg")
        # The probe's stdout passes through head: one byte past its limit head ends, the probe
        # gets SIGPIPE, and the client sees the size (so nothing unbounded is ever sent). Its exit
        # status comes back through a file (the pipeline's status is head's); `read` is a builtin, and
        # `tail` runs only for a probe that wrote to stderr (a fork and an exec less for most probes).
        frame = (
            f"printf '\\n{mark} begin {probe.name}\\n'\n"
            f"{{ (\n{probe.script}\n) </dev/null 2>\"$gpuops_tmp/err\"; echo $? >\"$gpuops_tmp/rc\"; }}"
            f" | head -c {probe.output_limit + 1}\n"
            f"read gpuops_rc <\"$gpuops_tmp/rc\" || gpuops_rc=141\n"
            f"printf '\\n{mark} stderr {probe.name} %d\\n' \"$gpuops_rc\"\n"
            f"[ ! -s \"$gpuops_tmp/err\" ] || tail -c {probe.output_limit} \"$gpuops_tmp/err\" 2>/dev/null\n"
            f"printf '\\n{mark} end {probe.name}\\n'"
        )
        parts.append(_unless(probe, frame, f"printf '\\n{mark} kept {probe.name}\\n'"))
    parts.append("exit 0")
    return "\n".join(parts) + "\n"


def _unless(probe: Probe[Any], text: str, otherwise: str) -> str:
    """``text``, or ``otherwise`` when the probe's ``unless`` condition holds on the host."""
    if not probe.unless:
        return text
    return f"if {probe.unless}\nthen\n{otherwise}\nelse\n{text}\nfi"


def split_gather_output(stdout: bytes | str, nonce: str) -> dict[str, ProbeOutput]:
    """The framed output of ``build_gather_script``, back into one ``ProbeOutput`` per probe.

    Split as bytes and decoded one frame at a time, so each probe's size is what the host sent
    and the whole output is never decoded at once."""
    data = stdout.encode("utf-8", "surrogateescape") if isinstance(stdout, str) else stdout
    mark = re.escape(f"@@gpuops:{nonce}".encode())
    frame = re.compile(
        rb"\n" + mark + rb" begin (?P<name>[^\n]+)\n(?P<out>.*?)\n" + mark + rb" stderr (?P=name) (?P<rc>-?\d+)\n"
        rb"(?P<err>.*?)\n" + mark + rb" end (?P=name)\n",
        re.DOTALL,
    )
    outputs: dict[str, ProbeOutput] = {}
    for match in frame.finditer(data):
        out = match.group("out")
        outputs[match.group("name").decode("utf-8", "replace")] = ProbeOutput(
            stdout=out.decode("utf-8", "replace"), stderr=match.group("err").decode("utf-8", "replace"),
            exit_status=int(match.group("rc")), size=len(out),
        )
    for match in re.finditer(rb"\n" + mark + rb" kept (?P<name>[^\n]+)\n", data):
        outputs.setdefault(match.group("name").decode("utf-8", "replace"), KEPT)
    return outputs


def parse_outputs(probes: Iterable[Probe[Any]], outputs: Mapping[str, ProbeOutput], why_missing: str = "") -> dict[str, Any]:
    """Apply each probe's parser; a missing frame or a parser bug becomes a ``ProbeFailure``."""
    values: dict[str, Any] = {}
    for probe in probes:
        output = outputs.get(probe.name)
        if output is None:
            values[probe.name] = ProbeFailure(probe.name, why_missing or "the probe's output never came back")
            continue
        if output.kept:
            # Only a probe that asked to be skipped may be answered "kept": anything else printing
            # such a frame is a confused (or hostile) script, and its probe has no value.
            values[probe.name] = (ProbeKept(probe.name) if probe.unless
                                  else ProbeFailure(probe.name, "the host said 'kept' for a probe that cannot be kept"))
            continue
        if output.size > probe.output_limit:  # cut by the host's head; a hostile host is held by the exec limit
            values[probe.name] = ProbeFailure(probe.name, f"{over_message(probe.output_limit)} (probe {probe.name})")
            continue
        try:
            values[probe.name] = probe.parse(output)
        except Exception as exc:  # a parser must not take the whole host down
            values[probe.name] = ProbeFailure(probe.name, f"cannot parse output: {type(exc).__name__}: {exc}")
    return values


GATHER_COMMAND = "exec /bin/sh -s"


def gather(conn: Connection, probes: Iterable[Probe[Any]], preamble: str = "", timeout: float | None = None) -> dict[str, Any]:
    """Run every probe on the host in ONE exec and return ``{probe name: parsed value}``."""
    probes = list(probes)
    nonce = new_nonce()
    script = build_gather_script(probes, nonce, preamble)
    result = conn.run(GATHER_COMMAND, stdin=script.encode(), timeout=timeout)
    _check_become(conn, result, probes, nonce)

    with timings.span("parse", getattr(getattr(conn, "host", None), "name", None)):
        outputs = split_gather_output(result.stdout, nonce)
        why = ""
        if len(outputs) < len(probes):
            tail = result.stderr_text().strip().splitlines()[-1:] or [f"exit status {result.exit_status}"]
            why = f"the gather script stopped early: {tail[0]}"
        return parse_outputs(probes, outputs, why)


def _check_become(conn: Connection, result: Any, probes: list[Probe[Any]], nonce: str) -> None:
    """Fail the host when sudo refused the gather: not one probe ran, so there are no facts to
    report as unknown, only a host that cannot be reached as asked (what apply says too). A gather
    that ran some probes and then stopped stays a partial gather, its missing facts unknown."""

    become = become_connection(conn)
    if become is None or not probes or f"@@gpuops:{nonce} begin " in result.stdout_text():
        return
    why = become.refusal(result)
    if why is not None:
        raise TransportError(conn.host.name, f"sudo refused: {why}")
