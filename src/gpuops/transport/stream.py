"""A command on a host that gpuops keeps talking to while it runs (apply's transaction channel).

``Connection.run`` sends all of stdin and waits for the end; the transaction needs more: lines read
as they come, messages written while the command runs (heartbeats, the verdict, the commit), and a
close that can be forced at any moment (a per-host deadline). Every connection opens its own with
``Connection.open_stream(command)``: paramiko's a ``ChannelStream`` (one more channel on the
host's existing connection, no second handshake), the local machine's and OpenSSH's a
``ProcessStream`` (``/bin/sh -c`` or ``ssh ... -- command`` as a subprocess); become and -v's
logging wrap whatever their inner connection opens.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from gpuops.errors import TransportError
from gpuops.transport.limits import STREAM_LINE_LIMIT, STREAM_STDERR_LIMIT, over_message

CLOSE_WAIT_S = 2.0  # a polite close that takes longer is stuck behind a stalled host: the stream is aborted


class Stream:
    """Lines from the command's stdout, as they come; ``send`` writes to its stdin."""

    def __init__(self) -> None:
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._stderr: list[bytes] = []
        self._stderr_size = 0
        self._send_lock = threading.Lock()
        self._closed = False  # no more sends
        self._ended = False  # close() ran
        self._close_lock = threading.Lock()
        self._stderr_ended = threading.Event()

    # the transport-specific parts
    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _pump(self, read: Any) -> None:
        """Thread: split what ``read()`` returns into lines; an empty line marks the end."""
        pending = b""
        try:
            while True:
                chunk = read()
                if not chunk:
                    break
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    self._lines.put(line + b"\n")
                if len(pending) > STREAM_LINE_LIMIT:  # a line without end: the host is not speaking the protocol
                    self._stderr_add(f"gpuops: a line from the host was {over_message(STREAM_LINE_LIMIT)}\n".encode())
                    pending = b""
                    break
        except (OSError, EOFError, ValueError):
            pass
        if pending:
            self._lines.put(pending)
        self._lines.put(b"")

    def _pump_stderr(self, read: Any) -> None:
        try:
            while True:
                chunk = read()
                if not chunk:
                    return
                self._stderr_add(chunk)
        except (OSError, EOFError, ValueError):
            return
        finally:
            self._stderr_ended.set()

    def _stderr_add(self, chunk: bytes) -> None:
        """Keep the stderr's last STREAM_STDERR_LIMIT bytes (its tail says why a command failed)."""
        self._stderr.append(chunk)
        self._stderr_size += len(chunk)
        while self._stderr_size > STREAM_STDERR_LIMIT and len(self._stderr) > 1:
            self._stderr_size -= len(self._stderr.pop(0))
        if self._stderr_size > STREAM_STDERR_LIMIT:
            self._stderr[0] = self._stderr[0][-STREAM_STDERR_LIMIT:]
            self._stderr_size = len(self._stderr[0])

    # the interface
    def send(self, data: bytes) -> bool:
        """Write to the command's stdin; False once the channel is gone."""
        with self._send_lock:
            if self._closed:
                return False
            try:
                self._write(data)
                return True
            except (OSError, EOFError, ValueError):
                return False
            except Exception:  # paramiko raises its own SSHException on a dead channel
                return False

    def readline(self, timeout: float) -> bytes | None:
        """The next line; None when nothing came within ``timeout``; b"" at the end."""
        try:
            line = self._lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if line == b"":
            self._lines.put(b"")  # the end stays the end for every later call
        return line

    def stderr_text(self, wait: float = 0.0) -> str:
        """What the command wrote to stderr so far; ``wait``: up to that long for all of it (the
        stdout's end can be read before the last of stderr, which says why the command ended)."""
        if wait > 0:
            self._stderr_ended.wait(wait)
        return b"".join(self._stderr).decode("utf-8", "replace")

    def close(self) -> None:
        """End the channel, politely (the helper sees its stdin end), within CLOSE_WAIT_S: a close
        stuck behind a stalled peer (sshd stopped while a send was under way holds paramiko's write
        lock, and this side's send lock, for good) is given up and the stream aborted instead."""
        with self._close_lock:
            if self._ended:
                return
            self._ended = True
        self._closed = True  # no later send starts (a send under way keeps its lock: not waited for)
        closer = threading.Thread(target=_quietly, args=(self._close,), name="close-stream", daemon=True)
        closer.start()
        closer.join(CLOSE_WAIT_S)
        if closer.is_alive():
            self.abort()

    def abort(self) -> None:
        """Cut the command off now, whatever waits on it (a send to a stalled host ends with an
        error): a per-host deadline passed, or a close got stuck. Never blocks for long."""
        self._closed = True
        cutter = threading.Thread(target=_quietly, args=(self._abort,), name="abort-stream", daemon=True)
        cutter.start()
        cutter.join(CLOSE_WAIT_S)

    def _abort(self) -> None:
        raise NotImplementedError


def _quietly(action: Any) -> None:
    try:
        action()
    except Exception:
        pass


class ChannelStream(Stream):
    """A new session channel on a live paramiko ``Transport``, running ``command``."""

    def __init__(self, transport: Any, command: str, connect_timeout: float, host: str) -> None:
        super().__init__()
        try:
            self.channel = transport.open_session(timeout=connect_timeout)
            self.channel.exec_command(command)
        except Exception as exc:
            raise TransportError(host, f"cannot start remote command: {exc}") from exc
        threading.Thread(target=self._pump, args=(lambda: self.channel.recv(65536),), daemon=True).start()
        threading.Thread(target=self._pump_stderr, args=(lambda: self.channel.recv_stderr(65536),), daemon=True).start()

    def _write(self, data: bytes) -> None:
        self.channel.sendall(data)

    def _close(self) -> None:
        self.channel.close()

    def _abort(self) -> None:
        # The host's whole connection: closing its transport ends every write blocked on it (a
        # channel close would queue behind them). Later commands to the host connect afresh.
        self.channel.get_transport().close()


class ProcessStream(Stream):
    """A local subprocess ``argv`` (``/bin/sh -c ...`` or ``ssh ... -- ...``) with piped stdio."""

    def __init__(self, argv: Sequence[str], host: str) -> None:
        super().__init__()
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise TransportError(host, f"cannot run {argv[0]}: {exc}") from exc
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout, self.proc.stderr
        threading.Thread(target=self._pump, args=(lambda: out.read1(65536),), daemon=True).start()  # type: ignore[attr-defined]  # a BufferedReader
        threading.Thread(target=self._pump_stderr, args=(lambda: err.read1(65536),), daemon=True).start()  # type: ignore[attr-defined]  # a BufferedReader

    def _write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def _close(self) -> None:
        # Closing stdin is what a dropped connection looks like to the helper; it ends by itself.
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def _abort(self) -> None:
        self.proc.kill()  # ssh (or the local shell): its pipes close, every write blocked on them ends

