"""Whole-host facts from probe outputs, the JSON schema, and the human rendering (pure)."""

from __future__ import annotations

import io
import json

from facts_fixtures import H200, KIMI, RTX8, driver_error, fixture_text, not_found, ok, server_output

from gpuops.facts.gpu import parse_banner, parse_query
from gpuops.facts.host import host_facts, probes_for
from gpuops.facts.render import render_host_facts
from gpuops.facts.server import parse_server
from gpuops.facts.software import parse_host_system, parse_python_packages
from gpuops.facts.to_json import facts_json
from gpuops.facts.topology import parse_p2p, parse_topo
from gpuops.gather import ProbeFailure, ProbeOutput
from gpuops.inventory import Host
from gpuops.output import make_console

PACKAGES = json.dumps({
    "python": {"executable": "/usr/bin/python3.12", "version": "3.12.3"},
    "packages": {
        "sglang": {"version": "0.5.8", "path": "/usr/lib/python3/dist-packages/sglang", "source": "metadata"},
        "flashinfer-python": {"version": "0.6.1", "path": "/x/flashinfer", "source": "metadata"},
        "sgl-kernel": {"version": "0.3.21", "path": "/x/sgl_kernel", "source": "metadata"},
        "torch": {"version": "2.9.1+cu128", "path": "/x/torch", "source": "metadata", "cuda": "12.8"},
        "nvidia-nccl-cu12": {"version": "2.27.5", "path": None, "location": "/x", "source": "metadata"},
        "nvidia-nccl-cu13": None,
    },
    "nccl": {"version": "2.27.5", "source": "nvidia-nccl-cu12", "path": "/x"},
})
SYSTEM = ("kernel=6.8.0\nmachine=x86_64\nos=\"Ubuntu 24.04.3 LTS\"\npython3=/usr/bin/python3\npython3_version=3.12.3\n"
          "chosen_python=/usr/bin/python3.12\nchosen_python_reason=the running SGLang server's interpreter (pid 4242, /proc/PID/exe)\n")


def smi_values(query, banner, topo, p2p) -> dict:
    """The four nvidia-smi probes' values, as the gather hands them to ``host_facts``."""
    return {"gpu.query": query, "gpu.banner": banner, "gpu.topo": topo, "gpu.p2p": p2p}


def _rtx8_values() -> dict:
    return {
        **smi_values(
            parse_query(ok(fixture_text(RTX8, "query.csv"))),
            parse_banner(ok("| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |\n")),
            parse_topo(ok(fixture_text(RTX8, "topo.txt"))),
            parse_p2p(ok(fixture_text(RTX8, "p2p.txt"))),
        ),
        "host.system": parse_host_system(ok(SYSTEM)),
        "software.python": parse_python_packages(ok(PACKAGES)),
        "server": parse_server(server_output(KIMI)),
    }


def test_rtx8_host_json_schema() -> None:
    facts = host_facts(_rtx8_values())
    doc = json.loads(json.dumps(facts_json(facts)))  # JSON-serialisable as is
    assert doc["gpu_status"] == {"known": True, "reason": None, "source": "nvidia-smi", "note": None}
    assert doc["gpu_count"] == 8
    gpu = doc["gpus"][0]
    for key in ("index", "name", "uuid", "compute_capability", "sm", "arch", "memory_total_mib", "pcie_gen", "pcie_width"):
        assert key in gpu
    assert (doc["compute_capability"], doc["sm"], doc["arch"]) == ("12.0", "sm120", "Blackwell")
    assert (doc["driver_version"], doc["cuda_driver_version"]) == ("580.95.05", "13.0")
    ic = doc["interconnect"]
    assert ic["nvlink"] is False and ic["p2p_all_pairs"] is False
    assert ic["numa"]["GPU4"] == {"cpu_affinity": "32-63,96-127", "numa_node": "1"}
    assert any("peer-to-peer" in w for w in ic["warnings"])
    sw = doc["software"]
    assert sw["sglang"] == {"version": "0.5.8", "path": "/usr/lib/python3/dist-packages/sglang", "source": "metadata"}
    assert sw["torch"]["cuda"] == "12.8"
    assert sw["nccl"]["version"] == "2.27.5"
    assert sw["os"] == "Ubuntu 24.04.3 LTS" and sw["kernel"] == "6.8.0"
    assert sw["python"]["version"] == "3.12.3"
    server = doc["server"]
    assert server["running"] and server["tp_size"] == 8 and server["port"] == 30000
    assert server["args"]["speculative_algorithm"] == "EAGLE3"
    assert server["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert server["manager"] == "systemd"
    # TP 8 with custom all-reduce on a box without P2P between all pairs: warned
    assert any("custom all-reduce will be disabled" in w for w in doc["warnings"])
    assert facts.torch_cuda == "12.8" and facts.compute_capability == "12.0"


def test_no_driver_host_is_unknown_everywhere_but_software() -> None:
    values = {
        **smi_values(parse_query(driver_error()), parse_banner(driver_error()), parse_topo(driver_error()),
                     parse_p2p(driver_error())),
        "host.system": parse_host_system(ok(SYSTEM)),
        "software.python": ProbeFailure("software.python", "the gather script stopped early: killed"),
    }
    doc = facts_json(host_facts(values))
    assert doc["gpu_status"]["known"] is False and "NVIDIA driver" in doc["gpu_status"]["reason"]
    assert doc["gpus"] == [] and doc["sm"] is None
    assert doc["interconnect"]["nvlink"] is None
    assert doc["software"]["known"] is False and "stopped early" in doc["software"]["reason"]
    assert doc["server"]["known"] is False and doc["server"]["reason"] == "probe server did not run"


def test_mixed_gpus_are_judged_at_the_lowest() -> None:
    values = _rtx8_values()
    mixed = parse_query(ok(
        "index, uuid, name, compute_cap\n0, a, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0\n1, b, NVIDIA H100 80GB HBM3, 9.0\n"))
    values["gpu.query"] = mixed
    facts = host_facts(values)
    assert facts.compute_capability == "9.0"
    assert facts_json(facts)["sm"] == "sm90"
    assert any("mixed GPU models" in w for w in facts.warnings)


def test_human_report_plain_text() -> None:
    stream = io.StringIO()
    render_host_facts(make_console(stream, force_terminal=False), facts_json(host_facts(_rtx8_values())))
    text = stream.getvalue()
    assert "\x1b[" not in text  # no colour codes off a terminal
    assert "NVIDIA RTX PRO 6000 Blackwell Server Edition" in text and "sm120" in text
    assert "no NVLink" in text and "P2P NOT between all pairs (16 pairs fail)" in text
    assert "GPU0-3 on node 0; GPU4-7 on node 1" in text
    assert "sglang 0.5.8" in text and "torch 2.9.1+cu128 (CUDA 12.8)" in text
    assert "managed by systemd (sglang.service)" in text
    assert "speculative EAGLE3 (steps 3, topk 1, draft tokens 4)" in text


def test_human_report_of_a_bare_host() -> None:
    values = {**smi_values(parse_query(not_found()), parse_banner(not_found()), parse_topo(not_found()), parse_p2p(not_found())),
              "server": parse_server(ProbeOutput("want_port=30000\nothers=\nhealth_error=refused\n", "", 0))}
    stream = io.StringIO()
    render_host_facts(make_console(stream, force_terminal=False), facts_json(host_facts(values)))
    text = stream.getvalue()
    assert "GPUs: unknown (nvidia-smi not found on PATH" in text
    assert "no SGLang server on port 30000" in text


def test_probes_carry_the_host_state_dir_quoted() -> None:
    host = Host(name="h", address=None, port=None, user=None, key_file=None, connection="ssh", groups=(),
                vars={"gpuops_state_dir": "/tmp/it's here"})
    names = [p.name for p in probes_for(host)]
    assert names == ["gpu.query", "gpu.banner", "gpu.procfs", "gpu.topo", "gpu.p2p", "host.system", "software.python",
                     "server", "gpuops.desired"]
    server_probe = probes_for(host)[-2]
    assert "gpuops_state_dir='/tmp/it'\"'\"'s here'" in server_probe.script
    assert "'/tmp/it'\"'\"'s here/desired.json'" in probes_for(host)[-1].script


def test_h200_real_capture_end_to_end() -> None:
    values = {
        **smi_values(parse_query(ok(fixture_text(H200, "query.csv"))), parse_banner(ok(fixture_text(H200, "smi.txt"))),
                     parse_topo(ok(fixture_text(H200, "topo.txt"))), parse_p2p(ok(fixture_text(H200, "p2p.txt")))),
    }
    doc = facts_json(host_facts(values))
    assert (doc["sm"], doc["arch"], doc["gpus"][0]["memory_total_mib"]) == ("sm90", "Hopper", 143771)
    assert doc["interconnect"]["nvlink"] is False and doc["interconnect"]["p2p_all_pairs"] is True
    assert doc["cuda_driver_version"] == "13.0"


def test_human_report_on_a_terminal_uses_rich_tables_and_colour() -> None:
    stream = io.StringIO()
    values = _rtx8_values()
    render_host_facts(make_console(stream, force_terminal=True), facts_json(host_facts(values)))
    text = stream.getvalue()
    assert "\x1b[" in text  # styled
    assert "sm120" in text and "Blackwell" in text
    assert "warning:" in text
