"""The agent's end of the SDK socket: who is speaking (from the kernel), their steps, their caps.

One thread serves every connection with a selector. A connection's peer is the process the
kernel names (SO_PEERCRED), pinned by its start time so a reused PID is never taken for it; its
pod comes from that process's cgroup. A peer in no pod, or over its pod's or the node's
connection limit, is told why and closed. Every read first checks the peer process is still
the one that connected: if it is gone or its PID is someone else's, the connection is closed
and what it sent is not counted for anyone.

Steps go into a bounded inbox per pod, handed to the coordinator every `flush_seconds`: a
flooding pod costs fixed memory here and there. Caps go out when the coordinator changes them
and on every hello, so an SDK that reconnects after an agent restart is told them at once.

Who may connect: containers run as any user, so the socket is 0666 and identity comes from
the kernel, not the file mode; the directory must be writable by the agent alone (Allocate
mounts it read-only) so no one can replace or remove the socket.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from gangshare.agent.cgroups import (
    PROC,
    ProcessId,
    pod_of_process,
    process_id,
    start_time_of,
    ticks_since_boot,
)
from gangshare.agent.sdklimits import (
    Inbox,
    Refusal,
    SdkLimits,
    admission,
    check_socket_dir,
    peer_pid,
)
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
# Accept errors that mean "out of something": waiting is the only cure.
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass
class _Session:
    sock: socket.socket
    uid: str
    peer: ProcessId
    buffer: bytearray = field(default_factory=bytearray)


class SdkServer:
    def __init__(
        self,
        path: Path,
        pod_of_pid: Callable[[int], str | None],
        on_steps: StepsSink,
        caps_of: CapsSource,
        limits: SdkLimits | None = None,
        proc: Path = PROC,
        boot_ticks: Callable[[], int] = ticks_since_boot,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.pod_of_pid = pod_of_pid
        self.on_steps = on_steps
        self.caps_of = caps_of
        self.limits = limits or SdkLimits()
        self.proc = proc
        self.boot_ticks = boot_ticks
        self.clock = clock
        # Why connections were refused or closed, by Refusal.kind; and accept pauses.
        self.refused: Counter[str] = Counter()
        self.accept_pauses = 0
        self._failing = False  # accept failed last time: pauses after the first log quietly
        self._selector = selectors.DefaultSelector()
        self._sessions: dict[socket.socket, _Session] = {}
        self._inboxes: dict[str, Inbox] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._paused_until: float | None = None
        self._flush_at = 0.0

    def start(self, listener: socket.socket | None = None) -> None:
        """Serve on `path`, or on `listener` (a bound, listening socket) when given."""
        if listener is None:
            listener = self._bind()
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ)
        self._flush_at = self.clock() + self.limits.flush_seconds
        self._thread = threading.Thread(target=self._serve, name="sdk-server", daemon=True)
        self._thread.start()

    def _bind(self) -> socket.socket:
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        check_socket_dir(self.path.parent)
        self.path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        # Containers run as any user; who they are comes from SO_PEERCRED, not from the mode.
        os.chmod(self.path, 0o666)
        listener.listen(64)
        return listener

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
            return dict(self._connections())

    def inbox(self, uid: str) -> Inbox | None:
        """A copy of what pod `uid` has reported and not yet handed on."""
        with self._lock:
            box = self._inboxes.get(uid)
            return None if box is None else replace(box, steps=deque(box.steps))

    def push(self, uid: str, caps: WireCaps) -> None:
        """Send caps to every connection of a pod; a peer that cannot take them is dropped."""
        data = caps_message(caps)
        with self._lock:
            targets = [s for s in self._sessions.values() if s.uid == uid]
        for session in targets:
            self._send(session, data)

    def flush(self) -> None:
        """Hand every pod's waiting steps to the coordinator (the server does it on its own)."""
        with self._lock:
            taken = {uid: box.take() for uid, box in self._inboxes.items()}
            drops = {uid: box.dropped for uid, box in self._inboxes.items() if box.dropped}
            live = set(self._connections())
            for uid in set(self._inboxes) - live:
                del self._inboxes[uid]
        for uid, report in taken.items():
            if report is not None:
                self.on_steps(uid, *report)
        for uid, dropped in drops.items():
            log.debug("pod %s: %d step times dropped so far (over the inbox)", uid, dropped)

    def _connections(self) -> Counter[str]:
        return Counter(s.uid for s in self._sessions.values())

    def _send(self, session: _Session, data: bytes) -> None:
        try:
            session.sock.send(data)
        except (BlockingIOError, OSError) as err:
            log.info("SDK of pod %s (pid %d) dropped: %s", session.uid, session.peer.pid, err)
            self._drop(session.sock)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._resume_accepting()
            for key, _ in self._selector.select(timeout=self._wait()):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    if sock is self._listener:
                        self._accept_some()
                    else:
                        self._read(sock)
                except Exception as err:  # one bad peer must not stop the server
                    log.warning("SDK socket: %s", err)
                    if sock is not self._listener:
                        self._drop(sock)
            if self.clock() >= self._flush_at:
                self._flush_at = self.clock() + self.limits.flush_seconds
                self.flush()

    def _wait(self) -> float:
        """Seconds to block in select: until the next flush or the end of an accept pause."""
        until = self._flush_at
        if self._paused_until is not None:
            until = min(until, self._paused_until)
        return min(0.5, max(0.0, until - self.clock()))

    # ----- accepting -----------------------------------------------------------------------

    def _accept_some(self) -> None:
        assert self._listener is not None
        for _ in range(self.limits.accepts_per_wake):
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as err:
                self._pause_accepting(err)
                return
            self._failing = False
            try:
                self._admit(conn)
            except OSError as err:  # the peer left before it was looked at
                log.info("SDK connection dropped at accept: %s", err)
                conn.close()

    def _pause_accepting(self, err: OSError) -> None:
        """Stop selecting the listener a while: it stays readable, so retrying at once spins."""
        assert self._listener is not None
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._listener)
        self._paused_until = self.clock() + self.limits.accept_pause_seconds
        self.accept_pauses += 1
        quiet = self._failing and err.errno in _EXHAUSTED
        self._failing = True
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "SDK socket: accept failed (%s); not accepting for %.1f s (pause %d)",
            err,
            self.limits.accept_pause_seconds,
            self.accept_pauses,
        )

    def _resume_accepting(self) -> None:
        if self._paused_until is None or self.clock() < self._paused_until:
            return
        self._paused_until = None
        if self._listener is not None and self._listener.fileno() >= 0:
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        accepted_at = self.boot_ticks()
        pid = peer_pid(conn)
        peer = process_id(pid, self.proc)
        uid = None if peer is None else pod_of_process(peer, self.pod_of_pid, self.proc)
        with self._lock:
            refusal = _peer_refusal(pid, peer, uid, accepted_at) or admission(
                uid or "", self._connections(), self.limits
            )
            if refusal is None and peer is not None and uid is not None:
                self._sessions[conn] = _Session(conn, uid, peer)
        if refusal is not None:
            self._refuse(conn, pid, refusal)
            conn.close()
            return
        self._selector.register(conn, selectors.EVENT_READ)
        log.info("SDK connected: pod %s, pid %d", uid, pid)

    def _refuse(self, conn: socket.socket, pid: int, refusal: Refusal) -> None:
        """Count and log why, and tell the peer; the caller closes the connection."""
        self.refused[refusal.kind] += 1
        log.info("SDK connection of pid %d refused: %s", pid, refusal.message)
        with contextlib.suppress(OSError):
            conn.send(encode({"error": refusal.message}))

    # ----- reading -------------------------------------------------------------------------

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
        if start_time_of(session.peer.pid, self.proc) != session.peer.start:
            # Its PID is gone or someone else's: nothing it sent is counted for anyone.
            self._refuse(sock, session.peer.pid, _gone(session.peer.pid))
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
            with self._lock:
                box = self._inboxes.setdefault(session.uid, Inbox(self.limits.pending_steps))
                box.add(steps, count)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            session = self._sessions.pop(sock, None)
        if session is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        sock.close()
        if self._paused_until is not None:
            self._paused_until = self.clock()  # a descriptor is free again: accept at once


def _peer_refusal(
    pid: int, peer: ProcessId | None, uid: str | None, accepted_at: int
) -> Refusal | None:
    """Why the process behind a new connection is not served, if it is not."""
    if peer is None:
        return _gone(pid)
    if peer.start > accepted_at:
        # Started after the connection was made: the PID's first holder died, this is another.
        return Refusal("peer-gone", f"process {pid} started after it connected (PID reused)")
    if uid is None:
        return Refusal("not-in-pod", f"process {pid} is not in a pod on this node")
    return None


def _gone(pid: int) -> Refusal:
    return Refusal("peer-gone", f"process {pid} that connected is gone or its PID was reused")
