"""The gather preamble: find the host's SGLang server (by port) and choose the python to probe with.

Every probe that needs python (the package probe, the gate scanner) must see the packages the
*running server* sees, so the interpreter is chosen in this order, in sh, on the host:

1. the running server's interpreter: its argv[0] when that is an absolute path (a venv's
   ``bin/python`` keeps the venv; ``/proc/PID/exe`` would resolve to the base interpreter and
   lose it), else ``/proc/PID/exe``; the server's ``PYTHONPATH`` is exported along with it.
   Skipped when the server runs under another root (a container): its paths mean nothing here;
2. the host var ``sglang_python`` (may be a wrapper script: used only if it behaves as python 3.8+);
3. the host var ``gpuops_python``, then ``python3``, then ``python`` on PATH.

With no server on the wanted port, the ``PYTHONPATH`` of the host var ``sglang_env`` (the server's
environment as gpuops launches it) is exported, so that an install there is seen before the server
starts.

It exports ``GPUOPS_PY`` (empty when there is none), ``GPUOPS_PY_REASON``, ``GPUOPS_SERVER_PID``
(empty when no server listens on the wanted port), ``GPUOPS_SERVER_PORT`` (the wanted port) and
``GPUOPS_SERVER_OTHERS`` ("pid:port ..." of SGLang servers on other ports).

Several servers may share one /proc (two servers on one box; in the lab, many simulated hosts on
one machine), so a server is matched by its ``--port`` against the host var ``sglang_port``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuops.errors import GpuopsError
from gpuops.remote.sglang_argv import DEFAULT_PORT as DEFAULT_SGLANG_PORT

if TYPE_CHECKING:
    from gpuops.inventory import Host

# How the preamble ends a gpuops_python that is not on the host (facts/host.py makes it a warning).
GPUOPS_PYTHON_MISSING = "is not on this host: apply, rollback and history cannot run"

# sh functions shared by the preamble and the server probe. Names are prefixed so they cannot
# collide with anything another probe defines.
_FUNCTIONS = r"""
gpuops_argv() { tr '\000' '\n' 2>/dev/null <"/proc/$1/cmdline"; }
gpuops_flag() {  # gpuops_flag PID --name: the value of --name (or --name=value) in PID's argv
  gpuops_argv "$1" | gpuops_flag_in "$2"
}
gpuops_flag_in() {  # argv on stdin, one word a line: the rules of gpuops/remote/sglang_argv.py (last one wins; a switch is empty)
  awk -v f="$1" 'n{n=0; if(substr($0,1,2)!="--"||$0=="--"){v=$0;next}} $0==f{n=1;v="";next} index($0,f"=")==1{v=substr($0,length(f)+2)} END{print v}'
}
gpuops_is_server() {  # argv on stdin, one word a line: remote/sglang_argv.py's is_server_argv (tests/unit/test_server_detection.py)
  awk 'function launch(w, n,   i, p, s) {
    for (i = 1; i <= n; i++) {
      if ((p == "-m" && w[i] == "sglang.launch_server") || (s && w[i] == "serve") || w[i] ~ /sglang\/launch_server\.py$/) return 1
      s = (w[i] ~ /(^|\/)sglang$/ || (p == "-m" && (w[i] == "sglang.cli.main" || w[i] == "sglang.cli"))); p = w[i]
    }
    return 0
  }
  { a[++n] = $0 }
  END {
    if (launch(a, n)) exit 0
    for (i = 2; i < n; i++) if (a[i] == "-c" && a[i - 1] ~ /(^|\/)(sh|bash|dash|zsh|ksh)$/) {
      m = split(a[i + 1], t, /[ \t\n\r\f\v]+/); k = 0; c = 0
      for (j = 1; j <= m; j++) if (t[j] == "exec") k = j
      if (k) { for (j = k + 1; j <= m; j++) if (t[j] != "") r[++c] = t[j]; if (launch(r, c)) exit 0 }
    }
    exit 1
  }'
}
gpuops_py_like() {  # an executable named like a python interpreter (the server already runs on it)
  [ -x "$1" ] && case "${1##*/}" in python|python3|python3.[0-9]|python3.[0-9][0-9]|pypy3*) true ;; *) false ;; esac
}
gpuops_py_ok() {  # does "$1" run as python >= 3.8? (-S: no site-packages to set up for one print)
  [ -n "$1" ] || return 1
  [ "$("$1" -S -c 'import sys; print("gpuops-py-ok" if sys.version_info >= (3, 8) else "too-old")' 2>/dev/null </dev/null)" = "gpuops-py-ok" ]
}
"""

_FIND_SERVER = r"""
GPUOPS_SERVER_PID=
GPUOPS_SERVER_OTHERS=
gpuops_matches=
for gpuops_f in $(grep -lsa -e sglang /proc/[0-9]*/cmdline 2>/dev/null); do
  gpuops_pid=${gpuops_f#/proc/}; gpuops_pid=${gpuops_pid%/cmdline}
  [ "$gpuops_pid" = "$$" ] && continue
  gpuops_argv "$gpuops_pid" | gpuops_is_server || continue
  gpuops_port=$(gpuops_flag "$gpuops_pid" --port)
  if [ "${gpuops_port:-30000}" = "$GPUOPS_SERVER_PORT" ]; then
    gpuops_matches="$gpuops_matches $gpuops_pid"
  else
    GPUOPS_SERVER_OTHERS="$GPUOPS_SERVER_OTHERS $gpuops_pid:${gpuops_port:-30000}"
  fi
done
# A wrapper script and the python it started, or forked workers, can all carry the same argv:
# prefer python processes, and among those the one whose parent is not itself a match.
gpuops_pys=
for gpuops_pid in $gpuops_matches; do
  case "$(readlink "/proc/$gpuops_pid/exe" 2>/dev/null)" in
    */python*|*/pypy*) gpuops_pys="$gpuops_pys $gpuops_pid" ;;
  esac
done
[ -n "$gpuops_pys" ] || gpuops_pys=$gpuops_matches
for gpuops_pid in $gpuops_pys; do
  gpuops_ppid=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$gpuops_pid/status" 2>/dev/null)
  case " $gpuops_pys " in *" $gpuops_ppid "*) continue ;; esac
  GPUOPS_SERVER_PID=$gpuops_pid
  break
done
if [ -z "$GPUOPS_SERVER_PID" ]; then
  for gpuops_pid in $gpuops_pys; do GPUOPS_SERVER_PID=$gpuops_pid; break; done
fi
export GPUOPS_SERVER_PID GPUOPS_SERVER_PORT GPUOPS_SERVER_OTHERS
"""

_CHOOSE_PYTHON = r"""
GPUOPS_PY=
GPUOPS_PY_REASON=
gpuops_why=
gpuops_root_of() { stat -L -c '%d:%i' "$1" 2>/dev/null; }
gpuops_own_root=$(gpuops_root_of /)
gpuops_srv_root=
[ -z "$GPUOPS_SERVER_PID" ] || gpuops_srv_root=$(gpuops_root_of "/proc/$GPUOPS_SERVER_PID/root/")
if [ -n "$gpuops_srv_root" ] && [ -n "$gpuops_own_root" ] && [ "$gpuops_srv_root" != "$gpuops_own_root" ]; then
  # A container: its interpreter path means nothing out here (and /usr/bin/python3 would be ours).
  gpuops_why="the server (pid $GPUOPS_SERVER_PID) runs in another root (a container), its python is not reachable from here; "
elif [ -n "$GPUOPS_SERVER_PID" ]; then
  gpuops_a0=$(gpuops_argv "$GPUOPS_SERVER_PID" | head -n 1)
  gpuops_exe=$(readlink "/proc/$GPUOPS_SERVER_PID/exe" 2>/dev/null)
  case "$gpuops_a0" in
    /*) if gpuops_py_like "$gpuops_a0" || gpuops_py_ok "$gpuops_a0"; then GPUOPS_PY=$gpuops_a0; GPUOPS_PY_REASON="the running SGLang server's interpreter (pid $GPUOPS_SERVER_PID, argv[0])"; fi ;;
  esac
  if [ -z "$GPUOPS_PY" ] && [ -n "$gpuops_exe" ] && { gpuops_py_like "$gpuops_exe" || gpuops_py_ok "$gpuops_exe"; }; then
    GPUOPS_PY=$gpuops_exe; GPUOPS_PY_REASON="the running SGLang server's interpreter (pid $GPUOPS_SERVER_PID, /proc/PID/exe)"
  fi
  if [ -n "$GPUOPS_PY" ]; then
    # The server's PYTHONPATH exactly: its value (an empty one too), or none when it has none (a
    # release environment gpuops built runs without one); left alone when its environ is unreadable.
    if gpuops_senv=$(tr '\000' '\n' 2>/dev/null <"/proc/$GPUOPS_SERVER_PID/environ"); then
      if printf '%s\n' "$gpuops_senv" | grep -q '^PYTHONPATH='; then
        PYTHONPATH=$(printf '%s\n' "$gpuops_senv" | sed -n 's/^PYTHONPATH=//p' | head -n 1); export PYTHONPATH
      else
        unset PYTHONPATH
      fi
    fi
  else
    gpuops_why="the server's interpreter (pid $GPUOPS_SERVER_PID) is not usable; "
  fi
fi
if [ -z "$GPUOPS_PY" ] && [ -n "$gpuops_sglang_python" ]; then
  if gpuops_py_ok "$gpuops_sglang_python"; then
    GPUOPS_PY=$gpuops_sglang_python; GPUOPS_PY_REASON="${gpuops_why}host var sglang_python"
  else
    gpuops_why="${gpuops_why}sglang_python $gpuops_sglang_python is not a python >= 3.8; "
  fi
fi
if [ -z "$GPUOPS_PY" ] && [ -n "$gpuops_helper_python" ]; then
  if gpuops_py_ok "$gpuops_helper_python"; then
    GPUOPS_PY=$gpuops_helper_python; GPUOPS_PY_REASON="${gpuops_why}host var gpuops_python"
  else
    gpuops_why="${gpuops_why}gpuops_python $gpuops_helper_python is not a python >= 3.8; "
  fi
fi
if [ -z "$GPUOPS_PY" ]; then
  for gpuops_c in python3 python; do
    gpuops_p=$(command -v "$gpuops_c" 2>/dev/null) || continue
    if gpuops_py_ok "$gpuops_p"; then GPUOPS_PY=$gpuops_p; GPUOPS_PY_REASON="${gpuops_why}$gpuops_c on PATH"; break; fi
    gpuops_why="${gpuops_why}$gpuops_p is not a python >= 3.8; "
  done
fi
[ -n "$GPUOPS_PY" ] || GPUOPS_PY_REASON="${gpuops_why}no python >= 3.8 found (server, sglang_python, python3, python)"
# A gpuops_python that is not there (apply, rollback and history run their helpers with it) is named
# even when another python was chosen here; a look, not a run (it costs no exec on every gather).
if [ -n "$gpuops_helper_python" ] && ! command -v "$gpuops_helper_python" >/dev/null 2>&1; then
  GPUOPS_PY_REASON="$GPUOPS_PY_REASON; gpuops_python $gpuops_helper_python %(missing)s"
fi
if [ -z "$GPUOPS_SERVER_PID" ] && [ -n "$gpuops_env_pythonpath_set" ]; then
  # No server to read it from: the PYTHONPATH gpuops launches the server with (an empty one too).
  PYTHONPATH=$gpuops_env_pythonpath; export PYTHONPATH
  [ -z "$GPUOPS_PY" ] || GPUOPS_PY_REASON="$GPUOPS_PY_REASON; PYTHONPATH from host var sglang_env"
fi
export GPUOPS_PY GPUOPS_PY_REASON
""".replace("%(missing)s", GPUOPS_PYTHON_MISSING)


def sglang_port(vars: Mapping[str, object]) -> int:
    """The port the host's SGLang server listens on (host var ``sglang_port``, default 30000)."""
    raw = vars.get("sglang_port", DEFAULT_SGLANG_PORT)
    try:
        port = int(str(raw).strip())
    except ValueError:
        port = -1
    if isinstance(raw, bool) or not 0 < port < 65536:
        raise GpuopsError(f"sglang_port must be a port number (1-65535), got {raw!r}")
    return port


def _optional_text(vars: Mapping[str, object], name: str) -> str:
    value = vars.get(name)
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or "\n" in str(value) or "\x00" in str(value):
        raise GpuopsError(f"{name} must be a single path, got {value!r}")
    return str(value)


def sglang_env_pythonpath(vars: Mapping[str, object]) -> str | None:
    """The ``PYTHONPATH`` in the host var ``sglang_env`` (the server's environment as gpuops
    launches it), or None when it sets none."""
    env = vars.get("sglang_env")
    if not isinstance(env, Mapping) or env.get("PYTHONPATH") is None:
        return None
    value = env["PYTHONPATH"]
    if not isinstance(value, str) or "\n" in value or "\x00" in value:
        raise GpuopsError(f"sglang_env's PYTHONPATH must be a single line of paths, got {value!r}")
    return value


def preamble_for_vars(vars: Mapping[str, object]) -> str:
    """The preamble for a host's vars; every value is passed to sh quoted."""
    port = sglang_port(vars)
    pythonpath = sglang_env_pythonpath(vars)
    return "\n".join(
        [
            "# gpuops: find the SGLang server and choose the python to probe with",
            f"GPUOPS_SERVER_PORT={port}",
            f"gpuops_sglang_python={shlex.quote(_optional_text(vars, 'sglang_python'))}",
            f"gpuops_helper_python={shlex.quote(_optional_text(vars, 'gpuops_python'))}",
            f"gpuops_env_pythonpath={shlex.quote(pythonpath or '')}",
            f"gpuops_env_pythonpath_set={'1' if pythonpath is not None else ''}",
            _FUNCTIONS.strip(),
            _FIND_SERVER.strip(),
            _CHOOSE_PYTHON.strip(),
        ]
    )


def preamble(host: Host) -> str:
    """sh text that sets and exports GPUOPS_PY, GPUOPS_PY_REASON and GPUOPS_SERVER_* for a host."""
    try:
        return preamble_for_vars(host.vars or {})
    except GpuopsError as exc:
        raise GpuopsError(f"{host.name}: {exc}") from None
