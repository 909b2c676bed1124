"""The bench client's HTTP side, on the host: requests to the SGLang server over loopback (native
``/generate``, OpenAI completions and chat), one streamed request timed chunk by chunk, and the
compact sample frame it becomes.

Token counts come from the server's own ``meta_info``/``usage``; with speculative decoding a chunk
may carry several tokens. Stdlib only, Python 3.8+.
"""

import http.client
import json
import random
import socket
import time

from gpuops.remote.sglang_server import ServerClient, ServerError, auth_headers, known_key, split_url


PROMPT_WORDS = ("alpha", "river", "stone", "cloud", "maple", "signal", "copper", "orbit", "lantern",
                "meadow", "falcon", "harbor", "cipher", "ember", "glacier", "violet")

# Where synthetic token ids are drawn from when the vocabulary holds it: a vocabulary this large
# gets the very prompts earlier releases of gpuops sent for the same seed (results stay comparable).
PROMPT_ID_RANGE = (1000, 20000)


def http_json(url, path, body=None, timeout=30.0):
    """One JSON request (``/generate`` without streaming, ...) through the server client."""
    return ServerClient(url, api_key=known_key(url), timeout=timeout).get_json(path, body, timeout)


def make_prompt_ids(seed, length, vocab_size):
    """``length`` token ids inside a vocabulary of ``vocab_size``, never one >= it: SGLang does not
    range-check ``input_ids``, and one out of range trips a device-side assert in the embedding
    gather that takes the whole server down (0.5.16, a model of 2000 tokens)."""
    high = min(PROMPT_ID_RANGE[1], vocab_size - 1)
    low = min(PROMPT_ID_RANGE[0], high // 2)  # clear of the special tokens at the bottom where there is room
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(length)]


def make_prompt_text(seed, length):
    rng = random.Random(seed)
    return " ".join(rng.choice(PROMPT_WORDS) for _ in range(length))


def prompt_vocab(snapshot, emitter):
    """The served model's vocabulary size for synthetic prompts (None: unknown, prompts are text),
    said in a note so that a result shows what its prompts were."""
    vocab = (snapshot or {}).get("vocab") or {}
    size = vocab.get("vocab_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        emitter.emit("note", {"message": "synthetic prompts: token ids below the model's vocabulary of %d (%s)"
                                         % (size, vocab.get("source"))})
        return size
    emitter.emit("note", {"message": "synthetic prompts: text the server tokenizes (the model's vocabulary "
                                     "is not known: %s)" % (vocab.get("reason") or "not read")})
    return None


def request_for(payload, model, index, seed, vocab_size=None):
    """(path, body) for request ``index``: the payload's request list (random lengths, ShareGPT
    prompts) when it has one, else the fixed --input-len/--output-len."""
    specs = payload.get("requests_spec") or []
    if specs:
        spec = specs[index % len(specs)]
        return build_request(payload["api"], model, seed, int(spec.get("input_len") or 1),
                             int(spec["output_len"]), prompt=spec.get("prompt"), vocab_size=vocab_size)
    return build_request(payload["api"], model, seed, int(payload["input_len"]), int(payload["output_len"]),
                         vocab_size=vocab_size)


def build_request(api, model, seed, input_len, output_len, stream=True, prompt=None, vocab_size=None):
    """(path, body) for one generation of exactly output_len tokens (ignore_eos).

    ``prompt``: a dataset's text (ShareGPT); else a synthetic prompt of ``input_len`` tokens: token
    ids inside ``vocab_size`` for the native API, or words the server tokenizes where the
    vocabulary is not known (a guessed id may lie outside it and kill the server).
    """
    if api == "native":
        if prompt is None and not vocab_size:
            prompt = make_prompt_text(seed, input_len)
        if prompt is not None:
            return "/generate", {
                "text": prompt,
                "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True},
                "stream": stream,
            }
        return "/generate", {
            "input_ids": make_prompt_ids(seed, input_len, vocab_size),
            "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True},
            "stream": stream,
        }
    common = {"model": model, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
              "stream": stream, "seed": seed}
    if stream:
        common["stream_options"] = {"include_usage": True}
    text = prompt if prompt is not None else make_prompt_text(seed, input_len)
    if api == "completions":
        common["prompt"] = text
        return "/v1/completions", common
    if api == "chat":
        common["messages"] = [{"role": "user", "content": text}]
        return "/v1/chat/completions", common
    raise ServerError("unknown api %r (native, completions, chat)" % api)


def _chunk_has_content(api, event):
    if api == "native":
        return True
    for choice in event.get("choices") or []:
        if api == "chat":
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                return True
        elif choice.get("text"):
            return True
    return False


def stream_request(url, api, path, body, timeout=600.0, stop=None):
    """Send one streaming request; return a sample with arrival times and cumulative token counts.

    ``chunks`` is a list of [seconds since send, cumulative completion tokens or None]: native
    chunks carry the server's cumulative count; OpenAI chunks do not, and get their counts from the
    final ``usage`` spread evenly (noted in the sample) since that is all the server says.
    """
    host, port, base = split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    sample = {"ok": False, "error": None, "chunks": [], "prompt_tokens": None, "completion_tokens": None}
    try:
        data = json.dumps(body).encode()
        t_send = time.perf_counter()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        headers.update(auth_headers(url))
        conn.request("POST", base + path, body=data, headers=headers)
        reply = conn.getresponse()
        if reply.status != 200:
            raw = reply.read()
            sample["error"] = "HTTP %d: %s" % (reply.status, raw[:300].decode("utf-8", "replace"))
            return sample
        chunks = sample["chunks"]
        usage = None
        done = False  # SGLang ends every stream it finishes with [DONE] (errors included)
        while True:
            if stop is not None and stop.is_set():
                sample["error"] = "interrupted"
                return sample
            line = reply.readline()
            if not line:
                break
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                event = json.loads(payload.decode("utf-8"))
            except ValueError:
                sample["error"] = "unparseable stream chunk: %r" % payload[:120]
                return sample
            if event.get("error") or event.get("object") == "error":
                err = event.get("error") or event
                sample["error"] = "server error mid-stream: %s" % (
                    err.get("message") if isinstance(err, dict) else err)
                return sample
            if api == "native":
                meta = event.get("meta_info") or {}
                count = meta.get("completion_tokens")
                if sample["prompt_tokens"] is None:
                    sample["prompt_tokens"] = meta.get("prompt_tokens")
                if count is not None and (not chunks or count > chunks[-1][1]):
                    chunks.append([now - t_send, int(count)])
                if count is not None:
                    sample["completion_tokens"] = int(count)
            else:
                if event.get("usage"):
                    usage = event["usage"]
                if _chunk_has_content(api, event):
                    chunks.append([now - t_send, None])
        if not done:
            sample["error"] = "the stream ended before [DONE]%s: %s" % (
                " after %d tokens" % chunks[-1][1] if chunks and chunks[-1][1] else "",
                SERVER_GONE % url if server_gone(url) else "the server closed it")
            return sample
        if api != "native":
            if not usage:
                sample["error"] = "the server sent no usage; token counts unknown"
                return sample
            sample["prompt_tokens"] = usage.get("prompt_tokens")
            sample["completion_tokens"] = int(usage.get("completion_tokens") or 0)
            spread_counts(chunks, sample["completion_tokens"])
            sample["counts_from"] = "usage spread over chunks"
        sample["e2e_s"] = time.perf_counter() - t_send
        if not chunks:
            sample["error"] = ("the stream carried no token counts (meta_info.completion_tokens)"
                               if api == "native" else "the stream carried no tokens")
            return sample
        sample["ok"] = True
        return sample
    except (OSError, socket.timeout, http.client.HTTPException) as exc:
        sample["error"] = "connection to %s failed: %s" % (url, exc)
        if not isinstance(exc, socket.timeout) and server_gone(url):
            sample["error"] += "; " + SERVER_GONE % url
        return sample
    finally:
        conn.close()


SERVER_GONE = "the server at %s no longer accepts connections: it stopped or died (its log says why)"


def server_gone(url, attempts=6, pause=0.5):
    """Whether nothing listens on the server's port any more: a server that dies mid-request (an
    out-of-range token id's device-side assert takes the whole of SGLang down) just ends its
    streams. Asked a few times: a dying server's listening socket outlives its last answer briefly."""
    try:
        host, port, _ = split_url(url)
    except ServerError:
        return False
    for attempt in range(attempts):
        if attempt:
            time.sleep(pause)
        try:
            socket.create_connection((host, port), timeout=2.0).close()
        except ConnectionRefusedError:
            return True
        except (ConnectionResetError, ConnectionAbortedError):
            continue  # the listening socket closed under this very connection: asked again
        except OSError:
            return False  # unreachable for another reason (a timeout, no route): not known to be gone
    return False


def spread_counts(chunks, total):
    """Give chunks without counts cumulative counts that end at ``total`` (first chunk: 1 token)."""
    n = len(chunks)
    if n == 0:
        return
    if n == 1:
        chunks[0][1] = total
        return
    rest = max(0, total - 1)
    for i, chunk in enumerate(chunks):
        chunk[1] = 1 + int(round(rest * i / float(n - 1))) if i else 1


def compact_sample(sample, index, extra=None):
    out = {"index": index, "ok": sample.get("ok"), "error": sample.get("error"),
           "prompt_tokens": sample.get("prompt_tokens"), "completion_tokens": sample.get("completion_tokens"),
           "e2e_s": sample.get("e2e_s"), "chunks": [[round(t, 6), c] for t, c in sample.get("chunks", [])]}
    if sample.get("counts_from"):
        out["counts_from"] = sample["counts_from"]
    if extra:
        out.update(extra)
    return out


def run_warmup(payload, model, emitter, stop, vocab_size=None):
    for i in range(int(payload.get("warmup", 2))):
        path, body = build_request(payload["api"], model, 10000 + i, min(32, int(payload["input_len"])),
                                   min(16, int(payload["output_len"])), vocab_size=vocab_size)
        sample = stream_request(payload["url"], payload["api"], path, body,
                                timeout=float(payload.get("request_timeout", 600)), stop=stop)
        if not sample["ok"]:
            raise ServerError("warm-up request failed: %s" % sample["error"])
