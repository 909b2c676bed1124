"""On a real GPU host: what the GPU probes of a patching apply cost, and what kept GPU facts save.
Local connection (no SSH). Prints JSON lines; run with PYTHONPATH=<gpuops src>."""
import json, os, subprocess, sys, time, tempfile
from gpuops.inventory import Host
from gpuops.transport.local import LocalConnection
from gpuops.gather import gather, ProbeKept
from gpuops.facts.python_select import preamble_for_vars
from gpuops.apply.runner import _gpu_probes, _gpu_summary
from gpuops.apply import kept_facts

os.environ["GPUOPS_FACTS_CACHE"] = tempfile.mkdtemp(prefix="kf-")
host = Host(name="device", address=None, port=None, user=None, key_file=None, connection="local", groups=(), vars={})
conn = LocalConnection(host)
pre = preamble_for_vars({})
for cmd in (["nvidia-smi", "--query-gpu=index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm", "--format=csv"],
            ["nvidia-smi"], ["nvidia-smi", "topo", "-m"], ["nvidia-smi", "topo", "-p2p", "r"]):
    walls = []
    for _ in range(5):
        s = time.perf_counter(); subprocess.run(cmd, capture_output=True); walls.append(round(time.perf_counter() - s, 4))
    print(json.dumps({"command": " ".join(cmd[:3]), "wall_s": walls}))
for run in range(1, 7):
    g = kept_facts.guard(host, _gpu_probes(host))
    s = time.perf_counter()
    values = gather(conn, g.probes, preamble=pre)
    wall = time.perf_counter() - s
    summary = kept_facts.summary(g, host.name, values, _gpu_summary)
    kept = sorted(n for n, v in values.items() if isinstance(v, ProbeKept))
    print(json.dumps({"run": run, "gather_wall_s": round(wall, 4), "offered": bool(g.held and g.held.fingerprint),
                      "kept_probes": kept, "fingerprint": values.get(kept_facts.FINGERPRINT_PROBE), "summary": summary}))
# the fingerprint's input text as the host sees it (before hashing), and its cost alone
held = kept_facts.read_held(kept_facts.cache_dir(), kept_facts.host_key(host))
script = kept_facts.setup_script(held.dirs if held else ())
text = script.replace("} 2>/dev/null | { sha256sum 2>/dev/null || cksum; } )", "} 2>/dev/null )").replace("gpuops_facts_fp=${gpuops_facts_fp%% *}", "")
out = subprocess.run(["sh", "-c", pre + "\n" + text + '\nprintf "%s" "$gpuops_facts_fp"'], capture_output=True, text=True).stdout
lines = [l for l in out.splitlines() if "UUID" not in l]
print(json.dumps({"fingerprint_input_lines": len(out.splitlines()), "head": lines[:40]}))
walls = []
for _ in range(10):
    s = time.perf_counter(); subprocess.run(["sh", "-c", pre + "\n" + script], capture_output=True); walls.append(round(time.perf_counter() - s, 4))
print(json.dumps({"preamble_plus_fingerprint_wall_s": walls}))
walls = []
for _ in range(10):
    s = time.perf_counter(); subprocess.run(["sh", "-c", pre], capture_output=True); walls.append(round(time.perf_counter() - s, 4))
print(json.dumps({"preamble_alone_wall_s": walls}))
