"""The SDK's end of the agent's unix socket: never blocks, never raises.

The training loop is the only thread that drives it, so every call returns at once: a report
the socket cannot take now is dropped, and a lost agent is retried at most once per
`retry_every` seconds. Callers serialise calls (the session's lock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
from collections.abc import Callable
from typing import Any

from gangshare.sdk.wire import MAX_LINE, WireError, decode

log = logging.getLogger("gangshare.sdk")

_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0) | getattr(socket, "MSG_DONTWAIT", 0)
# Reads per poll: a peer that floods the socket must not hold the training loop.
_MAX_READS = 16


class AgentConnection:
    def __init__(
        self,
        path: str,
        hello: Callable[[], bytes],
        retry_every: float = 1.0,
        getpid: Callable[[], int] = os.getpid,
    ) -> None:
        self.path = path
        self._hello = hello
        self._retry_every = retry_every
        self._getpid = getpid
        self._sock: socket.socket | None = None
        self._pid = 0
        self._last_try: float | None = None
        self._in = b""
        # The unsent tail of a line a full socket took only part of; it must go out before
        # anything else or the agent would read a broken line.
        self._out = b""
        # Set when a send would have blocked, until the socket is writable again.
        self._full = False
        # Set while the rest of an over-long line is being thrown away.
        self._skipping = False
        self.attempts = 0
        self.connects = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None and self._pid == self._getpid()

    def ensure(self, now: float) -> bool:
        """Connected, or one attempt made if the last was `retry_every` ago; True on a new one."""
        if self._sock is not None and self._pid != self._getpid():
            # A forked child shares the parent's socket: the agent would mistake one for the
            # other, and two writers would interleave lines. Close only our copy of it.
            self._drop(shutdown=False)
            self._last_try = None
        if self._sock is not None:
            return False
        if self._last_try is not None and now - self._last_try < self._retry_every:
            return False
        self._last_try = now
        self.attempts += 1
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:  # out of file descriptors, say: try again later
            return False
        try:
            sock.setblocking(False)
            sock.connect(self.path)
        except OSError:
            sock.close()
            return False
        self._sock, self._pid = sock, self._getpid()
        self._in, self._out, self._skipping, self._full = b"", b"", False, False
        self.connects += 1
        if not self.send(self._hello()):
            return False
        log.debug("connected to the gangshare agent at %s", self.path)
        return True

    def ready(self) -> bool:
        """Whether a send may go through: connected, and no line's tail still waiting.

        Lets a caller skip building a message that a full socket would drop anyway.
        """
        sock = self._sock
        if sock is None or not self.connected:
            return False
        if self._full:
            try:
                _, writable, _ = select.select([], [sock], [], 0.0)
            except (OSError, ValueError):
                writable = []
            if not writable:
                return False
            self._full = False
        if not self._out:
            return True
        sent = self._write(sock, self._out)
        if sent is None:
            return False
        self._out = self._out[sent:]
        return not self._out

    def send(self, data: bytes) -> bool:
        if not self.ready():
            return False
        sock = self._sock
        assert sock is not None
        sent = self._write(sock, data)
        if sent is None:
            return False
        self._out = data[sent:]
        return True

    def _write(self, sock: socket.socket, data: bytes) -> int | None:
        """Bytes the socket took now; None when it took none (full, or the agent is gone)."""
        try:
            return sock.send(data, _FLAGS)
        except BlockingIOError:
            self._full = True
            return None
        except OSError:
            self._drop()
            return None

    def poll(self) -> list[dict[str, Any]]:
        """Every whole message waiting; lines that are not JSON objects are skipped."""
        sock = self._sock
        if sock is None or not self.connected:
            return []
        for _ in range(_MAX_READS):
            try:
                chunk = sock.recv(MAX_LINE, _FLAGS)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                log.debug("the gangshare agent closed the connection")
                messages = self._lines()
                self._drop()
                return messages
            self._in += chunk
        return self._lines()

    def wait(self, timeout: float) -> None:
        """Until a message may be waiting or `timeout` passes."""
        sock = self._sock
        if sock is None:
            return
        # OSError/ValueError: closed under us by another thread; the next poll sees it.
        with contextlib.suppress(OSError, ValueError):
            select.select([sock], [], [], max(0.0, timeout))

    def close(self) -> None:
        self._drop(shutdown=False)

    def _lines(self) -> list[dict[str, Any]]:
        *lines, self._in = self._in.split(b"\n")
        messages = []
        for line in lines:
            if self._skipping:
                self._skipping = False
                continue
            try:
                messages.append(decode(line))
            except WireError as err:
                log.debug("ignored a line from the agent: %s", err)
        if len(self._in) > MAX_LINE:
            self._in, self._skipping = b"", True
        return messages

    def _drop(self, shutdown: bool = True) -> None:
        sock, self._sock = self._sock, None
        self._in, self._out, self._skipping, self._full = b"", b"", False, False
        if sock is None:
            return
        if shutdown:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        sock.close()
