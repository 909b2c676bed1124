"""The SGLang server as it runs: process, flags, environment in effect, health, manager, model.

The preamble (``python_select``) has already found the server's pid by port. This probe reads
what /proc says about it and ships it home as ``key=value`` lines; anything a process controls
(argv, environment, cgroup, the model's config.json) travels base64-encoded, so no value can break
the framing. The environment is filtered on the host to NCCL_/SGLANG_/CUDA_-style names, so other
variables (tokens, passwords) never leave the host, and credential-looking names are redacted too.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import field, replace
from typing import TYPE_CHECKING

from gpuops.facts.software import kv_lines
from gpuops.secret_policy import mask_args, mask_value
from gpuops.gather import Probe, ProbeOutput, value_or_unknown
from gpuops.remote.service_base import HEALTH_PROBE_TIMEOUT_S
from gpuops.frozen import frozen

if TYPE_CHECKING:  # imported where a running server is parsed: apply's GPU facts never need them
    from gpuops.facts.served_model import ModelFacts
    from gpuops.facts.server_args import ServerSettings
    from gpuops.facts.server_report import ServerReport

ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_", "TORCH_NCCL_", "FLASHINFER_", "NVSHMEM_")
HEALTH_TIMEOUT_S = HEALTH_PROBE_TIMEOUT_S  # /health runs a generation: >= 1.03 s on a real 0.5.16 server
CONFIG_LIMIT_BYTES = 1 << 20

DOCKER_FORMAT = ('{"id":{{json .Id}},"name":{{json .Name}},"image":{{json .Config.Image}},"image_id":{{json .Image}},'
                 '"cmd":{{json .Config.Cmd}},"entrypoint":{{json .Config.Entrypoint}},"state":{{json .State}},'
                 '"restart_count":{{json .RestartCount}},'
                 '"network_mode":{{json .HostConfig.NetworkMode}},"mounts":{{json .Mounts}}}')
SYSTEMD_PROPERTIES = ("Id", "ActiveState", "SubState", "MainPID", "NRestarts", "ExecStart", "Environment",
                      "EnvironmentFiles", "DropInPaths", "FragmentPath", "User", "WorkingDirectory", "Restart")

_ENV_GREP = "^(" + "|".join(p.rstrip("_") + "_" for p in ENV_PREFIXES) + ")"

# Runs after the preamble: $GPUOPS_SERVER_PID (maybe empty), $GPUOPS_SERVER_PORT, $GPUOPS_PY.
SERVER_SCRIPT = r"""
gpuops_b64() { base64 2>/dev/null | tr -d '\n'; }
echo "want_port=$GPUOPS_SERVER_PORT"
echo "others=$GPUOPS_SERVER_OTHERS"
gpuops_pid=$GPUOPS_SERVER_PID
gpuops_host=127.0.0.1
if [ -n "$gpuops_pid" ]; then
  echo "pid=$gpuops_pid"
  command -v base64 >/dev/null 2>&1 || echo "b64_error=base64 (coreutils) is not installed on the host: the command line, environment and model config cannot be read"
  echo "ppid=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$gpuops_pid/status" 2>/dev/null)"
  echo "exe=$(readlink "/proc/$gpuops_pid/exe" 2>/dev/null)"
  echo "argv_b64=$(cat "/proc/$gpuops_pid/cmdline" 2>/dev/null | gpuops_b64)"
  echo "cgroup_b64=$(cat "/proc/$gpuops_pid/cgroup" 2>/dev/null | gpuops_b64)"
  # Run by a systemd unit: what systemd itself says it runs (drop-ins, env files, restarts).
  gpuops_unit=$(sed -n 's|^[0-9]*:[^:]*:.*/\([^/]*\.service\)$|\1|p' "/proc/$gpuops_pid/cgroup" 2>/dev/null | head -n 1)
  if [ -n "$gpuops_unit" ] && command -v systemctl >/dev/null 2>&1; then
    echo "systemd_b64=$(systemctl show "$gpuops_unit" --no-pager @SYSTEMD_PROPS@ 2>/dev/null | gpuops_b64)"
  fi
  # Run in a docker container: what docker says (image, command, restarts, health); of its
  # environment only the variable names the server facts keep, filtered here on the host.
  gpuops_cid=$(sed -n 's|.*docker[-/]\([0-9a-f]\{64\}\).*|\1|p' "/proc/$gpuops_pid/cgroup" 2>/dev/null | head -n 1)
  if [ -n "$gpuops_cid" ] && command -v docker >/dev/null 2>&1; then
    echo "docker_b64=$(docker inspect --type container -f '@DOCKER_FORMAT@' "$gpuops_cid" 2>/dev/null | gpuops_b64)"
    echo "docker_env_b64=$(docker inspect --type container -f '{{range .Config.Env}}{{println .}}{{end}}' "$gpuops_cid" 2>/dev/null | grep -E '@ENV_GREP@' | gpuops_b64)"
    gpuops_image=$(docker inspect --type container -f '{{.Image}}' "$gpuops_cid" 2>/dev/null)
    [ -n "$gpuops_image" ] && echo "docker_digests_b64=$(docker image inspect -f '{{json .RepoDigests}}' "$gpuops_image" 2>/dev/null | gpuops_b64)"
  fi
  # One variable a line: a newline inside a value becomes \001 (and back), so a value cannot
  # smuggle in a line that looks like another variable.
  if gpuops_env=$(tr '\n\000' '\001\n' 2>/dev/null <"/proc/$gpuops_pid/environ"); then
    echo "env_b64=$(printf '%s\n' "$gpuops_env" | grep -E '@ENV_GREP@' | tr '\n\001' '\000\n' | gpuops_b64)"
  else
    echo "env_error=cannot read /proc/$gpuops_pid/environ (the server runs as another user; inspect as that user or root)"
    gpuops_env=
  fi
  if [ -n "$gpuops_state_dir" ] && [ -r "$gpuops_state_dir/sglang.pid" ]; then
    echo "pidfile_pid=$(tr -dc '0-9' 2>/dev/null <"$gpuops_state_dir/sglang.pid")"
  fi
  gpuops_h=$(gpuops_flag "$gpuops_pid" --host)
  case "$gpuops_h" in ""|0.0.0.0|::|"[::]") ;; *:*) gpuops_host="[$gpuops_h]" ;; *) gpuops_host=$gpuops_h ;; esac
  # The model's config.json: a local dir, the same path inside the server's container, or the HF cache.
  gpuops_mp=$(gpuops_flag "$gpuops_pid" --model-path)
  [ -n "$gpuops_mp" ] || gpuops_mp=$(gpuops_flag "$gpuops_pid" --model)
  if [ -n "$gpuops_mp" ]; then
    gpuops_cfg=
    for gpuops_c in "$gpuops_mp/config.json" "/proc/$gpuops_pid/root$gpuops_mp/config.json"; do
      if [ -f "$gpuops_c" ] && [ -r "$gpuops_c" ]; then gpuops_cfg=$gpuops_c; break; fi
    done
    if [ -z "$gpuops_cfg" ]; then
      case "$gpuops_mp" in
        /*|.*) ;;
        */*)
          gpuops_hh=$(printf '%s\n' "$gpuops_env" | sed -n 's/^HF_HOME=//p' | head -n 1)
          gpuops_hc=$(printf '%s\n' "$gpuops_env" | sed -n 's/^HF_HUB_CACHE=//p' | head -n 1)
          gpuops_home=$(printf '%s\n' "$gpuops_env" | sed -n 's/^HOME=//p' | head -n 1)
          [ -n "$gpuops_hc" ] || gpuops_hc="${gpuops_hh:-${gpuops_home:-$HOME}/.cache/huggingface}/hub"
          gpuops_repo=$(printf '%s' "$gpuops_mp" | sed 's|/|--|g')
          for gpuops_c in "$gpuops_hc/models--$gpuops_repo"/snapshots/*/config.json; do
            if [ -r "$gpuops_c" ]; then gpuops_cfg=$gpuops_c; break; fi
          done
          ;;
      esac
    fi
    if [ -n "$gpuops_cfg" ]; then
      echo "config_path=$gpuops_cfg"
      echo "config_b64=$(head -c @CONFIG_LIMIT@ "$gpuops_cfg" | gpuops_b64)"
    else
      echo "config_error=no readable config.json for the model path"
    fi
  fi
fi
gpuops_url="http://$gpuops_host:$GPUOPS_SERVER_PORT/health"
echo "health_url=$gpuops_url"
if command -v curl >/dev/null 2>&1; then
  gpuops_code=$(curl -s -o /dev/null --noproxy '*' -m @HEALTH_TIMEOUT@ -w '%{http_code}' "$gpuops_url" 2>/dev/null)
  case "$?:$gpuops_code" in
    7:*) echo "health_error=connection refused" ;;
    28:*) echo "health_error=no answer within @HEALTH_TIMEOUT@ s" ;;
    *:000|*:) echo "health_error=no HTTP answer" ;;
    *) echo "health=$gpuops_code" ;;
  esac
elif [ -n "$GPUOPS_PY" ]; then
  "$GPUOPS_PY" -c '
import sys, urllib.request, urllib.error
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    print("health=%d" % opener.open(sys.argv[1], timeout=float(sys.argv[2])).status)
except urllib.error.HTTPError as e:
    print("health=%d" % e.code)
except Exception as e:
    print("health_error=%s" % ((str(getattr(e, "reason", e)) or type(e).__name__).splitlines() or ["?"])[0])
' "$gpuops_url" @HEALTH_TIMEOUT@
else
  echo "health_error=no python or curl on the host to ask /health with"
fi
# What the server says about itself, asked with its own python through gpuops' one server client.
if [ -n "$gpuops_pid" ] && [ -n "$GPUOPS_PY" ]; then
  echo "reported_b64=$("$GPUOPS_PY" - "http://$gpuops_host:$GPUOPS_SERVER_PORT" "$gpuops_pid" 2>/dev/null <<'GPUOPS_SERVER_REPORT' | gpuops_b64
@SERVER_REPORT@
GPUOPS_SERVER_REPORT
)"
fi
"""


@frozen
class ServerFacts:
    """The SGLang server on the host's port, as /proc, its health check and its manager show it: its process,
    redacted flags, filtered environment, health, what runs it and the model it serves; ``known`` False, with
    ``reason``, when the probe failed."""

    known: bool
    reason: str | None = None
    running: bool = False
    pid: int | None = None
    ppid: int | None = None
    want_port: int | None = None
    others: tuple[tuple[int, int], ...] = ()  # (pid, port) of SGLang servers on other ports
    argv: tuple[str, ...] = ()  # redacted
    settings: ServerSettings | None = None
    env: dict[str, str] | None = None
    env_reason: str | None = None
    health_url: str | None = None
    health_status: int | None = None
    healthy: bool | None = None
    health_error: str | None = None
    manager: str | None = None  # "systemd" | "docker" | "process" | "gpuops-process"
    unit: str | None = None  # systemd unit, or container id
    python: str | None = None  # the server's interpreter
    model: ModelFacts | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    systemd: SystemdUnitFacts | None = None  # what systemd says, when a unit runs the server
    docker: DockerContainerFacts | None = None  # what docker says, when a container runs it
    reported: ServerReport | None = None  # what the server says about itself (/server_info)

    @property
    def metrics_enabled(self) -> bool | None:
        """Whether /metrics is on: the server's own word, else its launch flag."""
        if self.reported is not None and self.reported.metrics_enabled is not None:
            return self.reported.metrics_enabled
        if self.settings is None:
            return None
        return bool(self.settings.args.get("enable_metrics"))


@frozen
class DockerContainerFacts:
    """``docker inspect`` of the server's container (environment filtered like the server's)."""

    id: str
    name: str
    image: str                        # as the container was created from (name:tag)
    image_id: str                     # sha256:... of the image it really runs
    repo_digests: tuple[str, ...]
    cmd: tuple[str, ...]
    entrypoint: tuple[str, ...]
    status: str
    health: str | None                # the HEALTHCHECK status, when the image has one
    restart_count: int | None
    network_mode: str
    mounts: tuple[str, ...]           # destinations inside the container
    env: dict[str, str]


@frozen
class SystemdUnitFacts:
    """``systemctl show`` of the unit that runs the server (verbatim where systemd's text is the fact)."""

    unit: str
    active_state: str
    sub_state: str
    main_pid: int | None
    n_restarts: int | None
    exec_start: str                # as systemd shows it: { path=... ; argv[]=... ; ... }
    exec_argv: str | None          # its argv[] part
    environment: tuple[str, ...]   # Environment= assignments (unit and drop-ins)
    environment_files: tuple[str, ...]
    drop_ins: tuple[str, ...]
    fragment_path: str
    user: str
    working_directory: str
    restart: str


def _b64(value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def parse_env(raw: bytes) -> dict[str, str]:
    """NUL-separated ``KEY=value`` entries (values may hold newlines), as /proc/PID/environ has them."""
    env: dict[str, str] = {}
    for entry in raw.decode("utf-8", errors="replace").split("\0"):
        key, sep, value = entry.partition("=")
        if sep and key.startswith(ENV_PREFIXES):
            env[key] = mask_value(key, value)
    return env


def classify_manager(cgroup: str, pid: int | None, pidfile_pid: int | None) -> tuple[str, str | None]:
    """How the server is run: from gpuops' own pid file, else its cgroup path.

    ``0::/system.slice/sglang.service`` is a systemd unit; ``docker-<id>.scope`` or ``/docker/<id>``
    a container; anything else (a login session, a shell) a plain process.
    """
    if pid is not None and pidfile_pid == pid:
        return "process", "gpuops pid file"
    paths = [line.split(":", 2)[-1] for line in cgroup.splitlines() if line.count(":") >= 2]
    for path in paths:
        match = re.search(r"(?:docker|libpod|containerd|cri-containerd|crio)[-/]([0-9a-f]{12,64})", path)
        if match or "/kubepods" in path:
            runtime = "kubernetes" if "/kubepods" in path else "docker"
            return runtime, match.group(1)[:12] if match else None
    for path in paths:
        units = [part for part in path.split("/") if part.endswith(".service")]
        if units and not units[-1].startswith("user@"):
            return "systemd", units[-1]
    return "process", None


def parse_server(out: ProbeOutput) -> ServerFacts:
    if out.exit_status != 0 and not out.stdout.strip():
        last = (out.stderr.strip().splitlines() or [f"exit status {out.exit_status}"])[-1]
        return ServerFacts(known=False, reason=f"the server probe failed: {last[:200]}")
    v = kv_lines(out.stdout)
    want_port = int(v["want_port"]) if v.get("want_port", "").isdigit() else None
    others = tuple(
        (int(pid), int(port))
        for pid, _, port in (item.partition(":") for item in v.get("others", "").split())
        if pid.isdigit() and port.isdigit()
    )
    health_status = int(v["health"]) if v.get("health", "").isdigit() else None
    healthy = health_status == 200 if health_status is not None else False
    # What the probe says whether or not a server runs on the port: each answer below adds to it.
    answered = ServerFacts(
        known=True,
        want_port=want_port,
        others=others,
        health_url=v.get("health_url"),
        health_status=health_status,
        healthy=healthy,
        health_error=v.get("health_error"),
    )
    if not v.get("pid", "").isdigit():
        notes: tuple[str, ...] = ()
        if others:
            listing = ", ".join(f"pid {p} on port {port}" for p, port in others[:5])
            if len(others) > 5:
                listing += f" and {len(others) - 5} more"
            notes = (f"no SGLang server on port {want_port}; found {listing} (set the host var sglang_port)",)
        return replace(answered, running=False, notes=notes)

    from gpuops.facts.served_model import model_from_config
    from gpuops.facts.server_args import settings_from_argv
    from gpuops.facts.server_report import parse_report

    pid = int(v["pid"])
    if v.get("b64_error"):
        return replace(answered, running=True, pid=pid, notes=(v["b64_error"],))
    argv_raw = _b64(v.get("argv_b64")) or b""
    argv = [w.decode("utf-8", errors="replace") for w in argv_raw.split(b"\0") if w]
    settings = settings_from_argv(argv)
    env_raw = _b64(v.get("env_b64"))
    env = parse_env(env_raw) if env_raw is not None and "env_error" not in v else None
    cgroup = (_b64(v.get("cgroup_b64")) or b"").decode("utf-8", errors="replace")
    pidfile_pid = int(v["pidfile_pid"]) if v.get("pidfile_pid", "").isdigit() else None
    manager, unit = classify_manager(cgroup, pid, pidfile_pid)
    systemd = parse_systemd_show(_b64(v.get("systemd_b64")))
    docker = parse_docker_inspect(_b64(v.get("docker_b64")), _b64(v.get("docker_env_b64")),
                                  _b64(v.get("docker_digests_b64")))
    model = None
    if settings.model_path:
        config = _b64(v.get("config_b64"))
        model = model_from_config(settings.model_path, v.get("config_path"), config, v.get("config_error"))
    return replace(
        answered,
        running=True,
        pid=pid,
        ppid=int(v["ppid"]) if v.get("ppid", "").isdigit() else None,
        argv=tuple(_redact_argv(argv)),
        settings=settings,
        env=env,
        env_reason=v.get("env_error") if env is None else None,
        manager=manager,
        unit=unit,
        python=(argv[0] if argv and argv[0].startswith("/") else v.get("exe")) or None,
        model=model,
        systemd=systemd,
        docker=docker,
        reported=parse_report(_b64(v.get("reported_b64"))),
    )


def parse_systemd_show(raw: bytes | None) -> SystemdUnitFacts | None:
    from gpuops.remote.service_systemd import environment_entries, exec_argv, parse_show

    if not raw:
        return None
    shown = parse_show(raw.decode("utf-8", errors="replace"))
    if not shown.get("Id"):
        return None

    def number(key: str) -> int | None:
        value = shown.get(key, "")
        return int(value) if value.isdigit() else None

    env_files = tuple(re.sub(r" \(ignore_errors=\w+\)$", "", line.strip())
                      for line in shown.get("EnvironmentFiles", "").split("\n") if line.strip())
    return SystemdUnitFacts(
        unit=shown["Id"], active_state=shown.get("ActiveState", ""), sub_state=shown.get("SubState", ""),
        main_pid=number("MainPID") or None, n_restarts=number("NRestarts"),
        exec_start=shown.get("ExecStart", ""), exec_argv=exec_argv(shown.get("ExecStart", "")),
        environment=tuple(_redact_assignment(e) for e in environment_entries(shown.get("Environment", ""))),
        environment_files=env_files, drop_ins=tuple(shown.get("DropInPaths", "").split()),
        fragment_path=shown.get("FragmentPath", ""), user=shown.get("User", ""),
        working_directory=shown.get("WorkingDirectory", ""), restart=shown.get("Restart", ""),
    )


def parse_docker_inspect(raw: bytes | None, env_raw: bytes | None, digests_raw: bytes | None) -> DockerContainerFacts | None:
    import json

    if not raw:
        return None
    try:
        info: object = json.loads(raw.decode("utf-8", errors="replace"))
        digests: object = json.loads(digests_raw.decode()) if digests_raw else []
    except ValueError:
        return None
    if not isinstance(info, dict) or not info.get("id"):
        return None
    env = parse_env((env_raw or b"").replace(b"\n", b"\0"))
    # .State.Health exists only for images with a HEALTHCHECK (a template naming it fails otherwise).
    raw_state = info.get("state")
    state: dict[str, object] = raw_state if isinstance(raw_state, dict) else {}
    health = found if isinstance(found := state.get("Health"), dict) else {}
    health_status = health.get("Status")
    restarts = info.get("restart_count")
    return DockerContainerFacts(
        id=str(info["id"]), name=str(info.get("name") or "").lstrip("/"), image=str(info.get("image") or ""),
        image_id=str(info.get("image_id") or ""),
        repo_digests=tuple(str(d) for d in digests) if isinstance(digests, list) else (),
        cmd=tuple(_redact_argv([str(w) for w in _listed(info.get("cmd"))])),
        entrypoint=tuple(str(w) for w in _listed(info.get("entrypoint"))),
        status=str(state.get("Status") or ""), health=str(health_status) if health_status is not None else None,
        restart_count=restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else None,
        network_mode=str(info.get("network_mode") or ""),
        mounts=tuple(str(m.get("Destination")) for m in _listed(info.get("mounts")) if isinstance(m, dict)),
        env=env,
    )


def _listed(value: object) -> list[object]:
    """A list of docker's JSON (a command, the mounts); null or anything else is none."""
    return value if isinstance(value, list) else []


def _redact_assignment(entry: str) -> str:
    name, eq, value = entry.partition("=")
    return f"{name}={mask_value(name, value)}" if eq else entry


def _redact_argv(argv: list[str]) -> list[str]:
    return mask_args(argv)


def server_script(state_dir: str | None) -> str:
    import shlex

    script = (
        SERVER_SCRIPT.replace("@ENV_GREP@", _ENV_GREP)
        .replace("@HEALTH_TIMEOUT@", str(HEALTH_TIMEOUT_S))
        .replace("@CONFIG_LIMIT@", str(CONFIG_LIMIT_BYTES))
        .replace("@DOCKER_FORMAT@", DOCKER_FORMAT)
        .replace("@SYSTEMD_PROPS@", " ".join(f"-p {p}" for p in SYSTEMD_PROPERTIES))
        .strip()
        .replace("@SERVER_REPORT@", _report_source())
    )
    return f"gpuops_state_dir={shlex.quote(state_dir or '')}\n{script}"


def _report_source() -> str:
    from gpuops import shipping

    return shipping.source("server_report").rstrip("\n")


def server_probe(state_dir: str | None = None) -> Probe[ServerFacts]:
    return Probe("server", server_script(state_dir), parse_server)


def probes(state_dir: str | None = None) -> list[Probe[object]]:
    """The server fact's probe (the running SGLang server, and gpuops' launch files in ``state_dir``)."""
    return [server_probe(state_dir)]


def from_values(values: Mapping[str, object]) -> ServerFacts:
    """The server fact from the parsed probe values (a probe that failed: unknown, with its reason)."""
    return value_or_unknown(values, "server", ServerFacts, lambda r: ServerFacts(known=False, reason=r))
