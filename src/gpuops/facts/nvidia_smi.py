"""Running nvidia-smi inside a probe, and saying clearly why it gave nothing.

nvidia-smi fails in a few recognisable ways: it is not installed (no driver), it cannot talk to the
driver (module not loaded: it prints "NVIDIA-SMI has failed ..." and exits 9), or it hangs on a
wedged GPU. Each becomes one readable reason instead of a crash or an empty table.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence

from gpuops.gather import ProbeOutput

SMI_TIMEOUT_S = 30
NOT_FOUND_STATUS = 127
TIMEOUT_STATUS = 124

QUERY_FIELDS = (
    "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,"
    "pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm"
)

# ANSI escapes: real `nvidia-smi topo -m` underlines its header even when writing to a file.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def failure_reason(out: ProbeOutput) -> str | None:
    """Why an nvidia-smi run gave no usable output, or None when it succeeded."""
    both = f"{out.stdout}\n{out.stderr}"
    if "couldn't communicate with the NVIDIA driver" in both or "NVIDIA-SMI has failed" in both:
        return (
            "nvidia-smi cannot communicate with the NVIDIA driver (driver not loaded, or a "
            f"driver/library version mismatch; exit status {out.exit_status})"
        )
    if out.exit_status == NOT_FOUND_STATUS:
        return "nvidia-smi not found on PATH (no NVIDIA driver installed?)"
    if out.exit_status == TIMEOUT_STATUS:
        return f"nvidia-smi did not answer within {SMI_TIMEOUT_S} s (wedged GPU or driver?)"
    if out.exit_status != 0:
        first = next((line.strip() for line in both.splitlines() if line.strip()), "no output")
        return f"nvidia-smi exited with status {out.exit_status}: {first[:200]}"
    if not out.stdout.strip():
        return "nvidia-smi printed nothing"
    return None


def batch_script(commands: Mapping[str, Sequence[str]], token: str) -> str:
    """sh text that runs several nvidia-smi commands AT ONCE and prints each one's output framed.

    Each nvidia-smi call initialises NVML, which costs from a tenth of a second to seconds on a
    big box; run side by side they cost the slowest one. Frames carry ``token`` (random per
    build) so no output can fake one. Missing nvidia-smi: one message, exit 127, for all of them.
    """
    mark = f"@@gpuops-smi:{token}"
    parts = [
        # No nvidia-smi (a container without the tools, a broken install): the kernel driver may
        # still list its GPUs under /proc/driver/nvidia; ship that instead.
        "if ! command -v nvidia-smi >/dev/null 2>&1; then\n"
        "  echo 'gpuops: nvidia-smi: not found on PATH' >&2\n"
        "  if [ -r /proc/driver/nvidia/version ]; then\n"
        f"    printf '\\n{mark} procfs 0\\n'\n"
        "    for gpuops_f in /proc/driver/nvidia/version /proc/driver/nvidia/gpus/*/information; do\n"
        "      [ -r \"$gpuops_f\" ] && { printf '== %s\\n' \"$gpuops_f\"; cat \"$gpuops_f\"; }\n"
        "    done\n"
        f"    printf '\\n{mark} err\\n'\n"
        "  fi\n"
        f"  exit {NOT_FOUND_STATUS}\n"
        "fi",
        'gpuops_sd=$(mktemp -d 2>/dev/null) || { gpuops_sd="${TMPDIR:-/tmp}/gpuops-smi.$$"; mkdir -m 700 "$gpuops_sd" || exit 1; }',
        "if command -v timeout >/dev/null 2>&1; then gpuops_to=\"timeout %d\"; else gpuops_to=; fi" % SMI_TIMEOUT_S,
    ]
    for name, args in commands.items():
        command = " ".join(shlex.quote(a) for a in ("nvidia-smi", *args))
        parts.append(
            f'( $gpuops_to {command} >"$gpuops_sd/{name}.out" 2>"$gpuops_sd/{name}.err"; '
            f'echo $? >"$gpuops_sd/{name}.rc" ) &'
        )
    parts.append("wait")
    for name in commands:
        parts.append(
            f"printf '\\n{mark} {name} %s\\n' \"$(cat \"$gpuops_sd/{name}.rc\" 2>/dev/null || echo 1)\"; "
            f'cat "$gpuops_sd/{name}.out" 2>/dev/null; '
            f"printf '\\n{mark} err\\n'; "
            f'cat "$gpuops_sd/{name}.err" 2>/dev/null'
        )
    parts.append('rm -rf "$gpuops_sd"')
    return "\n".join(parts)


def new_token() -> str:
    return secrets.token_hex(6)


def split_batch(out: ProbeOutput, names: Sequence[str], token: str) -> dict[str, ProbeOutput]:
    """The framed output of ``batch_script`` back into one ProbeOutput per command."""
    mark = re.escape(f"@@gpuops-smi:{token}")
    frame = re.compile(rf"\n{mark} (?P<name>\S+) (?P<rc>-?\d+)\n(?P<out>.*?)\n{mark} err\n(?P<err>.*?)(?=\n{mark} |\Z)", re.DOTALL)
    found = {m.group("name"): ProbeOutput(m.group("out"), m.group("err"), int(m.group("rc"))) for m in frame.finditer(out.stdout)}
    if out.exit_status == NOT_FOUND_STATUS or not found:
        # nvidia-smi missing (or the batch died first): every command shares that fate; what the
        # kernel driver says about its GPUs ("procfs") comes along when it was there.
        status = out.exit_status if out.exit_status != 0 else 1
        failed = {name: ProbeOutput("", out.stderr, status) for name in names}
        return {**failed, **{k: v for k, v in found.items() if k not in names}}
    missing = ProbeOutput("", "gpuops: this nvidia-smi call gave no output frame", 1)
    return {**{k: v for k, v in found.items() if k not in names}, **{name: found.get(name, missing) for name in names}}
