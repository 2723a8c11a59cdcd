"""The agent's end of the SDK socket: who is speaking (from the kernel), their steps, their caps.

One thread serves every connection with a selector. A connection's pod is found once, from
the peer's PID (SO_PEERCRED) and that PID's cgroup; a peer in no pod is told why and closed.
Steps go to the coordinator as they come; caps go out when the coordinator changes them and
on every hello, so an SDK that reconnects after an agent restart is told its caps at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gangshare.sdk.wire import (
    MAX_LINE,
    WireCaps,
    WireError,
    caps_message,
    decode,
    encode,
    read_steps,
)

log = logging.getLogger("gangshare.agent")

StepsSink = Callable[[str, tuple[float, ...], int | None], None]
CapsSource = Callable[[str], WireCaps | None]


@dataclass
class _Session:
    sock: socket.socket
    uid: str
    pid: int
    buffer: bytearray = field(default_factory=bytearray)


class SdkServer:
    def __init__(
        self,
        path: Path,
        pod_of_pid: Callable[[int], str | None],
        on_steps: StepsSink,
        caps_of: CapsSource,
    ) -> None:
        self.path = path
        self.pod_of_pid = pod_of_pid
        self.on_steps = on_steps
        self.caps_of = caps_of
        self._selector = selectors.DefaultSelector()
        self._sessions: dict[socket.socket, _Session] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        # Containers run as any user; who they are comes from SO_PEERCRED, not from the mode.
        os.chmod(self.path, 0o666)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name="sdk-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for session in list(self._sessions.values()):
                session.sock.close()
            self._sessions.clear()
        if self._listener is not None:
            self._listener.close()
        self.path.unlink(missing_ok=True)

    def connected(self) -> dict[str, int]:
        """Pod uid -> how many SDK connections it has."""
        with self._lock:
            out: dict[str, int] = {}
            for session in self._sessions.values():
                out[session.uid] = out.get(session.uid, 0) + 1
            return out

    def push(self, uid: str, caps: WireCaps) -> None:
        """Send caps to every connection of a pod; a peer that cannot take them is dropped."""
        data = caps_message(caps)
        with self._lock:
            targets = [s for s in self._sessions.values() if s.uid == uid]
        for session in targets:
            self._send(session, data)

    def _send(self, session: _Session, data: bytes) -> None:
        try:
            session.sock.send(data)
        except (BlockingIOError, OSError) as err:
            log.info("SDK of pod %s (pid %d) dropped: %s", session.uid, session.pid, err)
            self._drop(session.sock)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            for key, _ in self._selector.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    if sock is self._listener:
                        self._accept()
                    else:
                        self._read(sock)
                except Exception as err:  # one bad peer must not stop the server
                    log.warning("SDK socket: %s", err)
                    if sock is not self._listener:
                        self._drop(sock)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        uid = self.pod_of_pid(pid)
        if uid is None:
            conn.sendall(encode({"error": f"process {pid} is not in a pod on this node"}))
            conn.close()
            return
        conn.setblocking(False)
        session = _Session(conn, uid, pid)
        with self._lock:
            self._sessions[conn] = session
        self._selector.register(conn, selectors.EVENT_READ)
        log.info("SDK connected: pod %s, pid %d", uid, pid)

    def _read(self, sock: socket.socket) -> None:
        with self._lock:
            session = self._sessions.get(sock)
        if session is None:
            return
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return
        if not chunk:
            self._drop(sock)
            return
        session.buffer += chunk
        while b"\n" in session.buffer:
            line, _, rest = session.buffer.partition(b"\n")
            session.buffer = bytearray(rest)
            self._handle(session, bytes(line))
        if len(session.buffer) > MAX_LINE:
            raise WireError(f"pod {session.uid}: a line over {MAX_LINE} bytes")

    def _handle(self, session: _Session, line: bytes) -> None:
        try:
            message = decode(line)
            steps, count = read_steps(message)
        except WireError as err:
            self._send(session, encode({"error": str(err)}))
            return
        if "hello" in message:
            caps = self.caps_of(session.uid)
            if caps is not None:
                self._send(session, caps_message(caps))
        if steps or count is not None:
            self.on_steps(session.uid, steps, count)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            session = self._sessions.pop(sock, None)
        if session is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        sock.close()
