"""The lab's stand-in answers for SGLang 0.5.16 as the real 0.5.16 server answered on the H200.

The recorded answers (tests/fixtures/real/h200-x1/sglang-0.5.16, README there: how they were made)
are the contract: the stand-in, run with the real 0.5.16 release on its path and the recorded
launch flags, must answer every recorded route with the same status, the same kind of body and the
same shape (keys, nested keys, JSON types), label its metrics as the real server labels them, emit
no metric series the real server lacks, and write the log lines that gpuops or an operator reads
in the real server's words. A drift in either (a stand-in change, or a new recording) fails here.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuops.lab import real_timing, sglang_cache
from gpuops.lab.standin_process import start_standin

REAL = Path(__file__).parents[1] / "fixtures" / "real" / "h200-x1" / "sglang-0.5.16"
# Keys only the stand-in sends, each labelled for what it is: ``simulated`` marks every simulated
# answer; ``speed_model`` says which figures it simulates; ``env`` shows tests the environment the
# stand-in was given (a real server reports none: gpuops reads a real server's environment from
# /proc, never from /server_info).
STANDIN_ONLY = {"simulated", "speed_model", "env"}


def recorded(name: str) -> dict[str, Any]:
    return json.loads((REAL / "http" / name).read_text())


def launch_flags() -> list[str]:
    argv = json.loads((REAL / "start.json").read_text())["argv"]
    flags = argv[argv.index("sglang.launch_server") + 1:]
    port = flags.index("--port")
    return flags[:port] + flags[port + 2:]  # the stand-in gets a free port of its own


def ask(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def shape_drift(real: Any, standin: Any, where: str = "$") -> list[str]:
    """Where the stand-in's JSON differs in shape from the real answer (empty: none)."""
    if real is None:
        return []  # a null in the real answer says nothing of the type a value would have
    if kind(real) != kind(standin):
        return [f"{where}: real {kind(real)}, stand-in {kind(standin)}"]
    if isinstance(real, dict):
        drift = [f"{where}.{k}: missing" for k in sorted(set(real) - set(standin))]
        drift += [f"{where}.{k}: the real server has no such key" for k in sorted(set(standin) - set(real) - STANDIN_ONLY)]
        for key in sorted(set(real) & set(standin)):
            if key != "internal_states":  # the scheduler's own state: its shape is the release's, not ours
                drift += shape_drift(real[key], standin[key], f"{where}.{key}")
        return drift
    if isinstance(real, list) and real and standin:
        return shape_drift(real[0], standin[0], f"{where}[0]")
    return []


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory):
    site = sglang_cache.sglang_site("0.5.16")
    model = tmp_path_factory.mktemp("model")
    # The recorded model's config.json, as far as /model_info reads it.
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    flags = launch_flags()
    flags[flags.index("--model-path") + 1] = str(model)
    with start_standin(tmp_path_factory.mktemp("standin"), flags, {"PYTHONPATH": str(site)}) as server:
        yield server


ROUTES = sorted(p.name for p in (REAL / "http").glob("*.json") if json.loads(p.read_text()).get("method") == "GET")


@pytest.mark.parametrize("name", ROUTES)
def test_each_recorded_route_answers_with_the_real_status_kind_and_shape(standin, name: str) -> None:
    real = recorded(name)
    status, ctype, body = ask(standin.url + real["path"])
    assert status == real["status"], f"{real['path']}: real {real['status']}, stand-in {status}"
    assert ctype.split(";")[0] == real["content_type"].split(";")[0], (real["path"], ctype, real["content_type"])
    if real["json"] is not None:
        answer = json.loads(body)
        if isinstance(answer, dict) and real["path"] in ("/model_info", "/get_model_info"):
            assert answer["model_type"] == "llama" and answer["architectures"] == ["LlamaForCausalLM"]
        assert shape_drift(real["json"], answer) == []
    elif real["path"] != "/metrics":
        assert body.decode() == real["text"]


def test_what_start_up_resolved_stays_the_same_in_every_answer(standin) -> None:
    """A real server draws its random seed once, at start-up: two answers of one process agree
    (a seed drawn per answer made two reads of one server look like two configurations)."""
    first, second = (json.loads(ask(standin.url + "/server_info")[2]) for _ in range(2))
    assert first["random_seed"] == second["random_seed"]


def series_labels(text: str) -> dict[str, set[str]]:
    """``{series name: its label names}`` of a Prometheus text page (histograms by their base name)."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^(sglang:[A-Za-z0-9_]+?)(?:_bucket|_sum|_count)?\{([^}]*)\}", line)
        if match:
            found.setdefault(match.group(1), set()).update(
                part.split("=", 1)[0] for part in re.findall(r'[a-z_]+="[^"]*"', match.group(2)) if part)
    return found


def test_metrics_are_series_the_real_server_emits_labelled_as_it_labels_them(standin) -> None:
    real = series_labels(recorded("metrics.json")["text"])
    status, _ctype, body = ask(standin.url + "/metrics")
    ours = series_labels(body.decode())
    assert status == 200 and ours
    assert sorted(set(ours) - set(real)) == [], "series the real server does not emit"
    for name, labels in ours.items():
        assert labels - {"le"} == real[name] - {"le"}, (name, sorted(labels), sorted(real[name]))


def test_the_log_lines_are_the_real_servers_words(standin) -> None:
    real_log = (REAL / "server.log").read_text()
    ours = standin.log()
    for line in ("server_args=ServerArgs(", "INFO:     Uvicorn running on http://",
                 "The server is fired up and ready to roll!"):
        assert line in real_log and line in ours, line
    standin.stop()
    for line in ("SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
                 "Gracefully exiting... Remaining number of requests 0."):
        assert line in real_log and line in standin.log(), line


def log_seconds(text: str, first: str, then: str) -> float:
    """Seconds between the log lines holding ``first`` and ``then`` (SGLang's ``[YYYY-mm-dd HH:MM:SS]``,
    gpuops' process manager's ``YYYY-mm-ddTHH:MM:SS``)."""
    def at(needle: str) -> float:
        line = next(line for line in text.splitlines() if needle in line)
        stamp = re.search(r"[ T](\d\d):(\d\d):(\d\d)[\]+]", line)
        assert stamp, line
        hours, minutes, seconds = (int(g) for g in stamp.groups())
        return hours * 3600 + minutes * 60 + seconds
    return at(then) - at(first)


def test_real_timing_is_the_recorded_servers() -> None:
    """``lab up --timing real`` takes the recorded figures: a warm start to the port and to healthy,
    each /health's time and the SIGTERM drain."""
    managed = (REAL / "managed-server.log").read_text()
    real_log = (REAL / "server.log").read_text()
    start = json.loads((REAL / "start.json").read_text())
    timing = {k: float(v) for k, v in real_timing.REAL_0516_H200.items()}
    assert timing["GPUOPS_STANDIN_LISTEN_AFTER_S"] == log_seconds(managed, "process_manager: start", "Uvicorn running")
    assert timing["GPUOPS_STANDIN_STARTUP_S"] == log_seconds(managed, "process_manager: start", "fired up and ready")
    assert min(start["health_poll_ms"]) / 1000 == pytest.approx(timing["GPUOPS_STANDIN_HEALTH_S"], abs=0.05)
    assert timing["GPUOPS_STANDIN_DRAIN_S"] == log_seconds(real_log, "SIGTERM received", "kill_process_tree")


def test_the_standin_takes_a_real_servers_health_and_drain_time(tmp_path: Path) -> None:
    """The two timings every lab apply meets (a health probe, a stop) as long as the real server's."""
    env = {k: v for k, v in real_timing.REAL_0516_H200.items()
           if k in ("GPUOPS_STANDIN_HEALTH_S", "GPUOPS_STANDIN_DRAIN_S")}
    with start_standin(tmp_path, ["--model-path", "m"], env) as server:
        started = time.monotonic()
        assert ask(server.url + "/health")[0] == 200
        assert time.monotonic() - started >= float(env["GPUOPS_STANDIN_HEALTH_S"])
        assert ask(server.url + "/v1/models")[0] == 200  # other routes answer at once
        started = time.monotonic()
        server.stop(timeout=30)
        assert time.monotonic() - started >= float(env["GPUOPS_STANDIN_DRAIN_S"])
