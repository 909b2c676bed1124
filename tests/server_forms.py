"""Start a process in each form an SGLang server is launched in, and read the argv the kernel shows
for it (``/proc/PID/cmdline``): the recorded cases of ``tests/unit/test_server_detection.py``.

The ``sglang`` package here is a stand-in that only sleeps (or, with ``GPUOPS_FORM_HEALTH_PORT``,
answers ``GET /health``); its console script is written the way pip writes SGLang's
(``sglang = sglang.cli.main:main`` in SGLang 0.5.8's entry_points.txt).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SERVE = '''import os, sys, time
port = os.environ.get("GPUOPS_FORM_HEALTH_PORT")
if port:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)  # /health, /get_model_info, ...: what apply's health wait asks
            self.end_headers()

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(port)), H).serve_forever()
time.sleep(60)
'''


def make_package(root: Path) -> dict[str, str]:
    """A stand-in sglang package and its console script under ``root``; returns paths by name."""
    (root / "sglang" / "cli").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "launch_server.py").write_text(SERVE)
    (root / "sglang" / "cli" / "__init__.py").write_text("")
    (root / "sglang" / "cli" / "main.py").write_text("def main():\n" + "".join("    " + line + "\n" for line in SERVE.splitlines())
                                                      + "\nif __name__ == '__main__':\n    main()\n")
    (root / "bin").mkdir()
    script = root / "bin" / "sglang"
    script.write_text(f"#!{sys.executable}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom sglang.cli.main import main\n"
                      "if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                      "    sys.exit(main())\n")
    script.chmod(0o755)
    run_script = root / "run-sglang.sh"
    run_script.write_text(f"sleep 60\nexec {sys.executable} -m sglang.launch_server --port 30005\n")
    return {"root": str(root), "script": str(script), "launch_server": str(root / "sglang" / "launch_server.py"),
            "run_script": str(run_script)}


def forms(paths: dict[str, str]) -> list[tuple[str, list[str], bool]]:
    """(name, argv to start, is it a server) for each form."""
    py = sys.executable
    return [
        ("python -m sglang.launch_server", [py, "-m", "sglang.launch_server", "--port", "30001"], True),
        ("sglang serve (venv console script)", [paths["script"], "serve", "--model-path", "/m", "--port", "30002"], True),
        ("python -m sglang.cli.main serve", [py, "-m", "sglang.cli.main", "serve", "--port", "30003"], True),
        ("python .../sglang/launch_server.py", [py, paths["launch_server"], "--tp", "2"], True),
        ("sh -c '...; exec python -m sglang.launch_server' (before the exec)",
         ["/bin/sh", "-c", f"sleep 60; exec {py} -m sglang.launch_server --port 30004"], True),
        ("env K=V python -m sglang.launch_server (after env execs the python)", ["/usr/bin/env", "NCCL_DEBUG=WARN", py, "-m", "sglang.launch_server"], True),
        ("sh -c that does not exec it", ["/bin/sh", "-c", "echo sglang serve; sleep 60"], False),
        ("python -m http.server", [py, "-m", "http.server", "--bind", "127.0.0.1", "0"], False),
        ("python with sglang.launch_server as a plain word", [py, "-c", "import time; time.sleep(60)", "sglang.launch_server"], False),
        ("a shell script that execs the server (before the exec: only its name tells)",
         ["/bin/sh", paths["run_script"]], False),
    ]


def recorded_argv(argv: list[str], root: str, env: dict[str, str] | None = None) -> list[str]:
    """Start ``argv``, read its /proc/PID/cmdline once it has settled (past any exec), stop it."""
    environ = {**os.environ, "PYTHONPATH": root, **(env or {})}
    proc = subprocess.Popen(argv, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as handle:
                words = [w.decode() for w in handle.read().split(b"\0") if w]
            if words and words == seen:
                return words
            seen = words
            time.sleep(0.3)
        return seen
    finally:
        proc.kill()
        proc.wait()
