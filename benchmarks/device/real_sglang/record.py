"""Record what a real SGLang server answers, on the GPU machine (stdlib only; run by run.sh).

    python3 record.py OUTDIR -- python3 -m sglang.launch_server ARGS...

Starts the server by hand in its own session, and records into OUTDIR:
- start.json: ms from exec to the port answering and to the first /health 200, each /health
  poll's own latency after that (SGLang 0.5.16's /health runs a 1-token generation, then sleeps 1 s);
- http/<route>.json: status, content type, elapsed ms and body (JSON parsed, or text) of every
  read-only route gpuops reads, /generate and /v1/completions, and the profiler's routes;
- ps.json: the server's process tree (pid, ppid, pgid, name, argv) read from /proc;
- profile.json: what POST /start_profile answered and the files its ranks wrote (names, sizes);
- stop.json: SIGTERM to the main pid: ms until each process is gone and the port is closed;
- server.log: the server's own output, start to exit.
Every request is bounded (timeout, size); nothing here blocks past its deadline.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

PORT = int(os.environ.get("PORT", "30000"))
BASE = f"http://127.0.0.1:{PORT}"
BODY_LIMIT = 400_000
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def now_ms():
    return time.monotonic() * 1000.0


def http(method, path, body=None, timeout=60.0):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    request = urllib.request.Request(BASE + path, data=data, method=method, headers=headers)
    started = now_ms()
    try:
        with OPENER.open(request, timeout=timeout) as answer:
            status, ctype, raw = answer.status, answer.headers.get("Content-Type", ""), answer.read(BODY_LIMIT)
    except urllib.error.HTTPError as error:
        status, ctype, raw = error.code, error.headers.get("Content-Type", ""), error.read(BODY_LIMIT)
    except Exception as error:  # noqa: BLE001 - recorded as the answer
        return {"status": -1, "error": repr(error), "elapsed_ms": round(now_ms() - started, 1)}
    text = raw.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return {"method": method, "path": path, "status": status, "content_type": ctype,
            "elapsed_ms": round(now_ms() - started, 1), "json": parsed,
            "text": None if parsed is not None else text}


def port_open():
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", PORT)) == 0


def proc_tree(root):
    rows = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = [part.decode("utf-8", "replace") for part in handle.read().split(b"\0") if part]
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        rows.append({"pid": int(entry), "ppid": int(fields[1]), "pgid": int(fields[2]),
                     "sid": int(fields[3]), "name": name, "argv": argv[:40]})
    by_parent = {}
    for row in rows:
        by_parent.setdefault(row["ppid"], []).append(row)
    keep = [row for row in rows if row["pid"] == root]
    for row in keep:  # grows while it is walked: breadth first down from the root
        keep.extend(by_parent.get(row["pid"], []))
    return sorted(keep, key=lambda row: row["pid"])


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def write(outdir, name, value):
    with open(os.path.join(outdir, name), "w") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)


def main():
    outdir, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    os.makedirs(os.path.join(outdir, "http"), exist_ok=True)
    log = open(os.path.join(outdir, "server.log"), "wb")
    started = now_ms()
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start = {"argv": argv, "port_open_ms": None, "health_ms": None, "deadline_s": 420}
    while now_ms() - started < start["deadline_s"] * 1000:
        if server.poll() is not None:
            start["died_rc"] = server.returncode
            break
        if start["port_open_ms"] is None and port_open():
            start["port_open_ms"] = round(now_ms() - started)
        if start["port_open_ms"] is not None and http("GET", "/health", timeout=5)["status"] == 200:
            start["health_ms"] = round(now_ms() - started)
            break
        time.sleep(0.25)
    start["health_poll_ms"] = [http("GET", "/health", timeout=10)["elapsed_ms"] for _ in range(3)]
    write(outdir, "start.json", start)
    print("start", json.dumps(start), flush=True)
    if start["health_ms"] is None:
        server.kill()
        return 1
    routes = ["/health", "/health_generate", "/server_info", "/get_server_info", "/model_info",
              "/get_model_info", "/v1/models", "/get_load", "/v1/loads", "/metrics", "/weight_version"]
    generate = {"text": "def main():", "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
    for path in routes:
        write(outdir, "http/" + path.strip("/").replace("/", "_") + ".json", http("GET", path))
    write(outdir, "http/generate.json", http("POST", "/generate", generate))
    completion = {"model": "default", "prompt": "import os", "max_tokens": 16, "temperature": 0}
    write(outdir, "http/v1_completions.json", http("POST", "/v1/completions", completion))
    write(outdir, "ps.json", proc_tree(server.pid))
    # The profiler (gpuops profile's issue): what the release answers, and the files it writes.
    profile_dir = "/tmp/sglang-profile"
    profile = {"start": http("POST", "/start_profile", {"output_dir": profile_dir, "num_steps": 5,
                                                        "activities": ["CPU", "GPU"]})}
    for _ in range(3):
        http("POST", "/generate", generate)
    profile["stop"] = http("POST", "/stop_profile", {})
    time.sleep(3)
    profile["files"] = []
    for base, _dirs, files in os.walk(profile_dir):
        for name in files:
            path = os.path.join(base, name)
            profile["files"].append({"path": path, "bytes": os.path.getsize(path)})
    write(outdir, "profile.json", profile)
    # SIGTERM to the main pid, as a service manager's stop sends it.
    tree = [row["pid"] for row in proc_tree(server.pid)]
    stop = {"pids": tree, "gone_ms": {}}
    stopped = now_ms()
    os.kill(server.pid, signal.SIGTERM)
    while now_ms() - stopped < 60_000 and (any(alive(pid) for pid in tree) or port_open()):
        for pid in tree:
            if str(pid) not in stop["gone_ms"] and not alive(pid):
                stop["gone_ms"][str(pid)] = round(now_ms() - stopped)
        if "port_closed_ms" not in stop and not port_open():
            stop["port_closed_ms"] = round(now_ms() - stopped)
        server.poll()
        time.sleep(0.05)
    for pid in tree:  # those that went in the last interval, after the loop's last look
        if str(pid) not in stop["gone_ms"] and not alive(pid):
            stop["gone_ms"][str(pid)] = round(now_ms() - stopped)
    if "port_closed_ms" not in stop and not port_open():
        stop["port_closed_ms"] = round(now_ms() - stopped)
    stop["all_gone"] = not any(alive(pid) for pid in tree)
    if not stop["all_gone"]:
        os.killpg(server.pid, signal.SIGKILL)
    stop["returncode"] = server.wait(timeout=10)
    write(outdir, "stop.json", stop)
    print("stop", json.dumps(stop), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
