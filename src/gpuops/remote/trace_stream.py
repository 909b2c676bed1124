"""The events of a Chrome trace (torch profiler's export, as SGLang writes each rank's), streamed.

A trace's ``traceEvents`` array can be hundreds of MB once decompressed, so it is never loaded
whole: the (gzip) file is read in chunks, and each event is decoded on its own with
``json.JSONDecoder.raw_decode`` as soon as its bytes are in the buffer. Everything is bounded:
the file's size on disk, the bytes decompressed, one value's size, the events kept by the caller;
a bound reached, a gzip cut short or a file that is not a trace is a ``TraceError`` of one line.
Only regular files are opened (``scan_read.open_regular``: never a FIFO or a device).

Host code: stdlib only, Python 3.8+.
"""

import codecs
import gzip
import json
import zlib

from gpuops.remote.scan_read import NotRead, open_regular

# What one trace may be. A real 0.5.16 trace of a tiny model for 5 steps is 377 KB gzipped
# (tests/fixtures/real/h200-x1/sglang-0.5.16/profile.json); a large model's per-rank trace of a few
# steps is tens of MB. 256 MiB on disk and 2 GiB decompressed leave room for that, and stop a
# trace that would take the host minutes and gigabytes to read.
FILE_BYTES_MAX = 256 << 20
JSON_BYTES_MAX = 2 << 30
VALUE_BYTES_MAX = 8 << 20  # one event (or one other top-level value): a kernel event is < 1 KB
_CHUNK = 1 << 20
_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


class TraceError(Exception):
    """Why a trace cannot be read, in one line."""


class _Buffer(object):
    """Decoded text of the file, refilled chunk by chunk; ``pos`` is where the parser stands."""

    def __init__(self, handle, json_limit, value_limit):
        self.handle = handle
        self.text = ""
        self.pos = 0
        self.eof = False
        self.read = 0
        self.json_limit = json_limit
        self.value_limit = value_limit
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def fill(self):
        if self.eof:
            return False
        try:
            chunk = self.handle.read(_CHUNK)
        except EOFError:
            raise TraceError("the gzip stream is cut short (the file ends before its end marker)")
        except (OSError, zlib.error) as exc:
            raise TraceError("cannot be decompressed (%s)" % exc)
        self.read += len(chunk)
        if self.read > self.json_limit:
            raise TraceError("holds more than %d MiB of JSON (the limit)" % (self.json_limit >> 20))
        if self.pos > _CHUNK:
            self.text, self.pos = self.text[self.pos:], 0
        self.text += self.decoder.decode(chunk, final=not chunk)
        if not chunk:
            self.eof = True
        return bool(chunk)

    def peek(self):
        """The next character that is not white space ('' at the end of the file)."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.fill():
                return ""

    def expect(self, char, what):
        found = self.peek()
        if found != char:
            raise TraceError("is not a Chrome trace: expected %r %s, found %r" % (char, what, found[:1] or "the end"))
        self.pos += 1

    def value(self):
        """The next JSON value, decoded once all of it is in the buffer."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except ValueError:
                value, end = None, -1
            # a number or literal at the buffer's end may go on in the next chunk
            if end != -1 and (end < len(self.text) or self.eof):
                self.pos = end
                return value
            if len(self.text) - self.pos > self.value_limit:
                raise TraceError("holds one value over %d MiB (the limit)" % (self.value_limit >> 20))
            if not self.fill():
                if end != -1:
                    self.pos = end
                    return value
                raise TraceError("ends in the middle of a value (cut short?)")


def _open(path, file_limit):
    try:
        raw = open_regular(path, file_limit)
    except NotRead as exc:
        raise TraceError(str(exc))
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def events(path, header=None, file_limit=FILE_BYTES_MAX, json_limit=JSON_BYTES_MAX, value_limit=VALUE_BYTES_MAX):
    """Each event (a dict) of the trace's ``traceEvents``, in file order. ``header``, a dict when
    given, receives the top-level keys met before ``traceEvents`` whose values are small scalars
    (``schemaVersion``, a stand-in's ``gpuops_simulated``). Reading stops at the array's end."""
    handle, raw = _open(path, file_limit)
    try:
        buf = _Buffer(handle, json_limit, value_limit)
        buf.expect("{", "at the start")
        while True:
            char = buf.peek()
            if char == ",":
                buf.pos += 1
                continue
            if char == "}" or char == "":
                raise TraceError("has no traceEvents array" if char else "ends before its traceEvents (cut short?)")
            key = buf.value()
            if not isinstance(key, str):
                raise TraceError("is not a Chrome trace: a key that is not a string")
            buf.expect(":", "after a key")
            if key != "traceEvents":
                value = buf.value()
                if header is not None and isinstance(value, (str, int, float, bool)) and len(str(value)) < 200:
                    header[key[:100]] = value
                continue
            buf.expect("[", "for traceEvents")
            while True:
                char = buf.peek()
                if char == "]":
                    return
                if char == ",":
                    buf.pos += 1
                    continue
                if char == "":
                    raise TraceError("ends before its traceEvents array closes (cut short?)")
                event = buf.value()
                if isinstance(event, dict):
                    yield event
    finally:
        handle.close()
        if raw is not handle:
            raw.close()
