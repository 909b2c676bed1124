"""The forking runner of ``labtools.CliZygote``: run as ``python cli_zygote.py``, it imports gpuops'
command line, every command module and the heavy libraries they import when they run (fabric,
paramiko, jinja2, yaml, rich) once, then runs each command it is sent in a forked child of its own,
as ``python -m gpuops.cli ARGS`` would: ``gpuops.cli.main`` in the command's cwd and environment,
with fd 0 on its input file (or /dev/null) and fd 1 and 2 on files of its own; SystemExit, an
uncaught exception (its traceback on stderr), atexit handlers, non-daemon threads and stream
flushes as the interpreter's exit does them. A child starts from the imported parent, never from an
earlier child: what one command changes in memory, the next does not see.

Protocol (JSON lines): each request on stdin is ``{"id", "args", "cwd", "env", "stdin", "out",
"err"}``; the runner answers ``{"id", "pid"}`` once it has forked and ``{"pid", "status"}`` when that
child has ended (the exit status as ``subprocess`` gives it: negative for a signal). Several
commands may run at once. It ends when its stdin closes.
"""

import atexit
import importlib
import json
import os
import select
import signal
import sys
import threading
import traceback

import gpuops.cli

for _target, _help in gpuops.cli.COMMANDS.values():
    importlib.import_module(_target.split(":")[0])
for _library in ("fabric", "paramiko", "jinja2", "jinja2.meta", "yaml", "rich.console", "rich.table"):
    importlib.import_module(_library)


def child(request, wakeup_fds):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in wakeup_fds:
        os.close(fd)
    source = request["stdin"] or os.devnull
    os.dup2(os.open(source, os.O_RDONLY), 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [gpuops.cli.__file__, *request["args"]]
    code = 0
    try:
        gpuops.cli.main(list(request["args"]))
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    os._exit(code)


def answer(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve():
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    requests = sys.stdin.buffer
    pending = b""
    while True:
        ready = select.select([requests.fileno(), wake_read], [], [])[0]
        if wake_read in ready:
            os.read(wake_read, 4096)
        while True:  # reap every child that has ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            answer({"pid": pid, "status": os.waitstatus_to_exitcode(status)})
        if requests.fileno() in ready:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    try:
                        child(request, (wake_read, wake_write))
                    finally:
                        os._exit(70)
                answer({"id": request["id"], "pid": pid})


serve()
