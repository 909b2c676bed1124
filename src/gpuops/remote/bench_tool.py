"""SGLang's own benchmark module (``--tool sglang``), run on the host with the server's python; its
JSONL result lines are relayed as ``tool`` frames.

A server started with ``--api-key`` answers its requests only with the key. SGLang's
``bench_serving`` takes no key flag: it reads ``OPENAI_API_KEY`` from its environment
(``get_auth_headers``: ``Authorization: Bearer KEY``), so the tool runs with the server's own key
there (never on its command line, which ``ps`` shows and the notes carry). A module whose source
reads no key (``bench_one_batch_server``) cannot bench such a server: refused, saying so.

Stdlib only, Python 3.8+ (bundled into ``bench_client``).
"""

import json
import os
import re
import signal
import subprocess

from gpuops.remote.bench_http import ServerError
from gpuops.remote.bench_workdir import in_temp_dir
from gpuops.remote.scan_read import NotRead, read_regular
from gpuops.remote.sglang_server import installed_root, known_key

# Where later releases moved SGLang's benchmark modules (0.5.16+: sglang/benchmark/; the old
# top-level modules stay as deprecation shims that warn): the new home is used where it exists.
NEW_HOMES = {"sglang.bench_serving": "sglang.benchmark.serving",
             "sglang.bench_one_batch_server": "sglang.benchmark.one_batch_server"}


def tool_module(module, root):
    """The module to run for ``module`` in the release at ``root`` (its ``sglang/`` dir): the new
    home where that release has it, else ``module`` (also when the release cannot be read)."""
    newer = NEW_HOMES.get(module)
    if newer and root and os.path.isfile(os.path.join(root, *newer.split(".")[1:]) + ".py"):
        return newer
    return module

# SGLang's largest benchmark module: 111,485 bytes (0.5.23 benchmark/serving.py; 0.5.16's 103,470).
SOURCE_LIMIT = 4 << 20

# How SGLang's benchmark modules take a server's key: ``os.environ.get("OPENAI_API_KEY")``.
KEY_ENV = "OPENAI_API_KEY"
_READS_KEY = re.compile(r"""os\.environ\.get\(\s*["']%s["']|os\.environ\[\s*["']%s["']\s*\]""" % (KEY_ENV, KEY_ENV))


def module_file(module, root):
    """The source file of ``module`` (``sglang.x.y``) in the release at ``root``, or None."""
    if not root or not module.startswith("sglang."):
        return None
    path = os.path.join(root, *module.split(".")[1:]) + ".py"
    return path if os.path.isfile(path) else None


def module_source(module, root):
    """The source text of the release's ``module``, read as the host's: a regular file, bounded
    (a FIFO in its place must not block the bench); None when it cannot be read."""
    path = module_file(module, root)
    try:
        return read_regular(path, SOURCE_LIMIT).decode("utf-8", "replace") if path else None
    except NotRead:
        return None


def reads_key(module, root):
    """Whether the release's ``module`` sends a key it reads from ``OPENAI_API_KEY`` (None: its
    source cannot be read)."""
    source = module_source(module, root)
    return None if source is None else _READS_KEY.search(source) is not None


def tool_env(module, root, url, server_env=None):
    """The tool's environment: the server's python's (``server_env``: the server's own PYTHONPATH,
    ``bench_snapshot.server_python_env``; else this process's), with the server's key as
    ``OPENAI_API_KEY`` when its command line gives one (a key the host's environment already holds
    is left to the operator). Raises ServerError when the server wants a key and the module sends none."""
    env = dict(server_env if server_env is not None else os.environ)
    key = known_key(url)
    if not key:
        return env
    if reads_key(module, root) is False:
        raise ServerError("%s sends no API key (its source reads no %s) and the server at %s was started with "
                          "--api-key: bench it with --tool gpuops" % (module, KEY_ENV, url))
    env[KEY_ENV] = key
    return env

# SGLang's "random" dataset samples ShareGPT's token ids and downloads ShareGPT from the Hub for it
# (benchmark/datasets/random.py); a host without the network fails there (a real 0.5.16 on the
# offline H200: LocalEntryNotFoundError). "random-ids" draws ids inside the tokenizer's vocabulary,
# as gpuops' own client does: asked for by default, and fitted here to what the release takes.
RANDOM_IDS = "random-ids"


def dataset_args(args, module, root):
    """``args`` with ``--dataset-name random-ids`` kept where the release's ``module`` knows that
    dataset, and dropped where it does not (0.5.8: its default, "random", as before); unchanged
    when the module's source cannot be read."""
    at = args.index("--dataset-name") if "--dataset-name" in args else -1
    if at < 0 or args[at + 1:at + 2] != [RANDOM_IDS]:
        return list(args)
    source = module_source(module, root)
    if source is None or '"%s"' % RANDOM_IDS in source:
        return list(args)
    return args[:at] + args[at + 2:]


NEEDS_SERVER = True
SERVER_AFTER = False  # the tool's own line carries what it measured


def expected_records(payload):
    return None  # the tool's progress is its own


def run_suite(payload, snapshot, emitter, stop):
    return suite_tool(payload, emitter, stop)


def suite_tool(payload, emitter, stop):
    in_temp_dir("gpuops-bench-tool-", lambda d: _suite_tool(payload, emitter, stop, d))


def _suite_tool(payload, emitter, stop, out_dir):
    """Run SGLang's own benchmark module with the server's python; relay its JSONL lines.

    One run per argv tail in ``tool.runs`` (bench_serving: one per concurrency level); each run
    appends its result line to the output file, which is read back once per run.
    """
    tool = payload["tool"]
    # Without the server's PYTHONPATH its python may not import sglang at all (a real 0.5.16 on
    # the H200: "No module named 'sglang'", the release installed on PYTHONPATH).
    server_env = payload.get("server_env")
    root = installed_root(tool.get("python"), server_env)
    module = tool_module(tool["module"], root)
    env = tool_env(module, root, payload["url"], server_env)
    for run_index, tail_args in enumerate(tool.get("runs") or [[]]):
        if stop.is_set():
            break
        out_file = os.path.join(out_dir, "result-%d.jsonl" % run_index)
        argv = [tool.get("python") or "python3", "-m", module, "--base-url", payload["url"]]
        argv += dataset_args([str(a) for a in tail_args], module, root)
        argv += [tool.get("output_flag", "--output-file"), out_file]
        emitter.emit("note", {"message": "running %s %s" % (module, " ".join(argv[5:]))})
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env)
        except OSError as exc:
            raise ServerError("cannot run %s: %s" % (argv[0], exc))
        tail = []
        try:
            for raw in iter(proc.stdout.readline, b""):
                tail.append(raw.decode("utf-8", "replace").rstrip())
                del tail[:-40]
                if stop.is_set() and proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = []
        if os.path.exists(out_file):
            with open(out_file) as handle:
                lines = [line for line in handle.read().splitlines() if line.strip()]
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                emitter.emit("note", {"message": "unparseable tool output line: %s" % line[:200]})
                continue
            if isinstance(record, dict):
                record.pop("server_info", None)  # already sent as the server record
                record["_run_index"] = run_index
            emitter.emit("tool", record)
        if (proc.returncode != 0 or not lines) and not stop.is_set():
            raise ServerError("%s exited %s: %s" % (module, proc.returncode, " | ".join(tail[-5:])))
