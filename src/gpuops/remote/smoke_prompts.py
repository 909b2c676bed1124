"""The correctness smoke check's prompts, sent on the host through the one server client
(``sglang_server``: the server's own ``--api-key`` read from its command line). Stdlib only,
Python 3.8+; shipped on stdin by ``apply/smoke.py`` with ``{"port", "max_tokens", "prompts", "timeout"}`` (one
prompt's time limit, ``gpuops_smoke_timeout``).

Prints one JSON line: ``{"outputs": [...]}`` or ``{"error": "..."}``.
"""

import json
import sys

from gpuops.remote.sglang_server import ServerClient, ServerError, find_server_pid


def run(payload):
    url = "http://127.0.0.1:%d" % int(payload["port"])
    timeout = float(payload.get("timeout") or 600.0)
    client = ServerClient.for_process(url, find_server_pid(url), timeout=timeout)
    out = []
    try:
        for prompt in payload["prompts"]:
            body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": int(payload["max_tokens"])}}
            out.append(client.get_json("/generate", body, timeout=timeout).get("text"))
    except ServerError as exc:
        return {"error": "ServerError: %s" % exc}
    return {"outputs": out}


def main():
    raw = globals().get("GPUOPS_PAYLOAD")
    payload = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else (raw or sys.stdin.read() or "{}"))
    print(json.dumps(run(payload)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
