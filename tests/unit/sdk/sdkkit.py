"""Test kit for the SDK: a stand-in node agent on a real unix socket, and a fake clock."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gangshare.sdk import Session
from gangshare.sdk.wire import (
    MEMORY_CAP_ENV,
    SM_CAP_ENV,
    SOCKET_ENV,
    WireCaps,
    caps_message,
)


class StubAgent:
    def __init__(self, path: str, greet: WireCaps | None = None) -> None:
        self.path = path
        # Caps pushed on every hello, as the real agent answers a (re)connect.
        self.greet = greet
        self.hellos: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        self.bad_lines: list[bytes] = []
        # While set, nothing is read: the SDK's sends pile up in the socket.
        self.holding = False
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.start()

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(8)
        listener.setblocking(False)
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, args=(listener,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The agent dies: its socket file goes and every connection is closed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def push(self, duty: float, memory_mib: int | None = None, generation: int = 1) -> None:
        self.send_raw(caps_message(WireCaps(duty, memory_mib, generation)))

    def send_raw(self, data: bytes) -> None:
        with self._lock:
            for conn in self._conns:
                conn.setblocking(True)
                conn.sendall(data)
                conn.setblocking(False)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def steps(self) -> list[float]:
        with self._lock:
            return [s for r in self.reports for s in r["steps"]]

    def last_count(self) -> int | None:
        with self._lock:
            return self.reports[-1]["count"] if self.reports else None

    def wait_for(self, what: Callable[[], object], timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            if time.monotonic() > deadline:
                raise AssertionError("the stub agent waited in vain")
            time.sleep(0.002)

    def _serve(self, listener: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ)
        buffers: dict[socket.socket, bytes] = {}
        try:
            while not self._stop.is_set():
                if self.holding:
                    time.sleep(0.005)
                    continue
                for key, _ in sel.select(timeout=0.005):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is listener:
                        conn, _ = listener.accept()
                        conn.setblocking(False)
                        with self._lock:
                            self._conns.append(conn)
                        buffers[conn] = b""
                        sel.register(conn, selectors.EVENT_READ)
                    else:
                        self._read(sel, sock, buffers)
        finally:
            sel.close()
            listener.close()

    def _read(
        self, sel: selectors.BaseSelector, sock: socket.socket, buffers: dict[socket.socket, bytes]
    ) -> None:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(sock)
            with self._lock:
                if sock in self._conns:
                    self._conns.remove(sock)
            sock.close()
            return
        *lines, buffers[sock] = (buffers[sock] + chunk).split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                self.bad_lines.append(line)
                continue
            if "hello" in message:
                if self.greet is not None:
                    sock.setblocking(True)
                    sock.sendall(caps_message(self.greet))
                    sock.setblocking(False)
                with self._lock:
                    self.hellos.append(message)
            elif "steps" in message:
                with self._lock:
                    self.reports.append(message)


class FakeTime:
    """A clock that only moves when a test (or the SDK's sleep) moves it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


def agent_env(path: str, sm: str | None = None, memory: str | None = None) -> dict[str, str]:
    env = {SOCKET_ENV: path}
    if sm is not None:
        env[SM_CAP_ENV] = sm
    if memory is not None:
        env[MEMORY_CAP_ENV] = memory
    return env


def fake_session(fake: FakeTime, env: dict[str, str], **kwargs: float) -> Session:
    """A session on the fake clock that talks to the agent at every step."""
    options: dict[str, float] = {"poll_every": 0.0, **kwargs}
    return Session(env, clock=fake.clock, sleep=fake.sleep, **options)


def run_steps(session: Session, fake: FakeTime, n: int, busy: float) -> None:
    for _ in range(n):
        with session.step():
            fake.advance(busy)
