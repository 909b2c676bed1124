"""The decode suite, on the host: one stream at a time, ``num_requests`` requests after warm-up.

Stdlib only, Python 3.8+ (bundled into ``bench_client``).
"""

from gpuops.remote.bench_http import compact_sample, prompt_vocab, request_for, run_warmup, stream_request
from gpuops.remote.bench_snapshot import model_name

NEEDS_SERVER = True
SERVER_AFTER = True


def expected_records(payload):
    return int(payload.get("num_requests", 5))


def run_suite(payload, snapshot, emitter, stop):
    return suite_decode(payload, model_name(snapshot), emitter, stop, prompt_vocab(snapshot, emitter))


def suite_decode(payload, model, emitter, stop, vocab_size=None):
    run_warmup(payload, model, emitter, stop, vocab_size)
    samples = []
    for i in range(int(payload.get("num_requests", 5))):
        if stop.is_set():
            break
        path, body = request_for(payload, model, i, int(payload.get("seed", 0)) + i, vocab_size)
        sample = stream_request(payload["url"], payload["api"], path, body,
                                timeout=float(payload.get("request_timeout", 600)), stop=stop)
        if sample.get("error") == "interrupted":
            break
        samples.append(sample)
        emitter.emit("sample", compact_sample(sample, i))
        if not sample["ok"] and payload.get("stop_on_error", True):
            break
    return samples
