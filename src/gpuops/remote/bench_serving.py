"""The serving suite, on the host: levels of concurrency (closed loop) or of request rate (seeded
Poisson arrivals, optionally capped), each summarised as SGLang's bench_serving does.

Stdlib only, Python 3.8+ (bundled into ``bench_client``).
"""

import random
import threading
import time

from gpuops.remote.bench_http import compact_sample, prompt_vocab, request_for, run_warmup, stream_request
from gpuops.remote.bench_snapshot import model_name
from gpuops.remote.bench_stats import summarize_samples

NEEDS_SERVER = True
SERVER_AFTER = True


def expected_records(payload):
    total = 0
    for concurrency, _ in serving_levels(payload):
        total += int(payload.get("requests_per_level") or max(4, 2 * (concurrency or 8)))
    return total


def run_suite(payload, snapshot, emitter, stop):
    return suite_serving(payload, model_name(snapshot), emitter, stop, prompt_vocab(snapshot, emitter))


def serving_levels(payload):
    """[(concurrency cap or None, request rate or None)]: closed-loop levels, or Poisson rates."""
    rates = payload.get("request_rates")
    if rates:
        cap = payload.get("max_concurrency")
        return [(int(cap) if cap else None, float(r)) for r in rates]
    return [(int(c), None) for c in payload.get("concurrency", [1, 4, 16, 64])]


def arrival_times(count, rate, seed):
    """Seconds after the level's start at which each request is sent: a Poisson process of
    ``rate`` requests/s (exponential gaps, seeded), or all at once for an infinite rate."""
    if rate is None or rate == float("inf") or rate <= 0:
        return [0.0] * count
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def suite_serving(payload, model, emitter, stop, vocab_size=None):
    run_warmup(payload, model, emitter, stop, vocab_size)
    levels = serving_levels(payload)
    slo = payload.get("slo") or None
    for level_index, (concurrency, rate) in enumerate(levels):
        if stop.is_set():
            break
        count = int(payload.get("requests_per_level") or max(4, 2 * (concurrency or 8)))
        samples = []
        lock = threading.Lock()
        # closed loop: `concurrency` workers; rate mode: a send schedule, at most `concurrency` in flight
        gate = threading.Semaphore(concurrency) if concurrency else None
        schedule = arrival_times(count, rate, int(payload.get("seed", 0)) + level_index)
        emitter.emit("progress", {"level": level_index, "levels": len(levels), "concurrency": concurrency,
                                  "request_rate": rate, "requests": count})

        def one(i):
            sent = time.perf_counter() - started
            try:
                seed = int(payload.get("seed", 0)) + 1000 * level_index + i
                path, body = request_for(payload, model, i, seed, vocab_size)
                sample = stream_request(payload["url"], payload["api"], path, body,
                                        timeout=float(payload.get("request_timeout", 600)), stop=stop)
                if sample.get("error") == "interrupted":
                    return
                with lock:
                    samples.append(sample)
                emitter.emit("sample", compact_sample(sample, i, {"concurrency": concurrency, "request_rate": rate,
                                                                  "sent_s": round(sent, 6)}))
            finally:
                if gate is not None:
                    gate.release()

        started = time.perf_counter()
        threads = []
        for i, at in enumerate(schedule):
            delay = started + at - time.perf_counter()
            while delay > 0 and not stop.is_set():
                time.sleep(min(delay, 0.2))
                delay = started + at - time.perf_counter()
            if gate is not None:
                while not gate.acquire(timeout=0.2):
                    if stop.is_set():
                        break
            if stop.is_set():
                break
            thread = threading.Thread(target=one, args=(i,))
            thread.daemon = True
            thread.start()
            threads.append(thread)
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
        duration = time.perf_counter() - started
        summary = summarize_samples(samples, duration, slo)
        summary["concurrency"] = concurrency
        summary["request_rate"] = rate
        if rate is not None and len(schedule) > 1 and schedule[-1] > 0:
            summary["scheduled_rate"] = (len(schedule) - 1) / schedule[-1]  # what the Poisson draw gave
        summary["partial"] = stop.is_set()
        emitter.emit("level", summary)
