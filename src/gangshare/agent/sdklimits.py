"""What the SDK socket allows: connections per pod and node, step times held per pod, the
folder the socket lives in. Pure bookkeeping, so sdkserver.py holds only the serving loop."""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path


class SdkSocketError(RuntimeError):
    pass


@dataclass(frozen=True)
class SdkLimits:
    # One SDK per process: a pod running one process per GPU on a 16-GPU node fits.
    per_pod: int = 16
    # Every connection is a file descriptor of the agent's; well under its limit.
    total: int = 512
    # Step times held per pod between flushes; older ones are dropped (and counted). At
    # 512 per 0.5 s a pod may report 1024 steps/s, far above any GPU training loop.
    pending_steps: int = 512
    flush_seconds: float = 0.5
    # How long accepting stops after accept failed (EMFILE, ...); a closed connection ends
    # the pause early.
    accept_pause_seconds: float = 0.5
    # Connections taken per wake of the listener, so a burst cannot starve reads.
    accepts_per_wake: int = 16


@dataclass(frozen=True)
class Refusal:
    kind: str  # counted in `refused`: not-in-pod, peer-gone, pod-limit, node-limit
    message: str  # sent to the peer and logged


@dataclass
class Inbox:
    """A pod's step times not yet given to the coordinator: the newest `limit` of them."""

    limit: int
    steps: deque[float] = field(default_factory=deque)
    count: int | None = None
    fresh: bool = False  # something arrived since the last take
    received: int = 0
    dropped: int = 0

    def add(self, steps: tuple[float, ...], count: int | None) -> None:
        self.received += len(steps)
        self.steps.extend(steps)
        while len(self.steps) > self.limit:
            self.steps.popleft()
            self.dropped += 1
        if count is not None:
            self.count = count
        self.fresh = True

    def take(self) -> tuple[tuple[float, ...], int | None] | None:
        if not self.fresh:
            return None
        steps = tuple(self.steps)
        self.steps.clear()
        self.fresh = False
        return steps, self.count


def peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def check_socket_dir(directory: Path) -> None:
    """Make sure only the agent can replace or remove what is in `directory`.

    The agent's own directory is tightened; one it does not own, or a shared sticky one such
    as /tmp, is refused rather than changed.
    """
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise SdkSocketError(f"{directory}: not a directory")
    open_to_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not open_to_others:
        return
    if info.st_uid == os.geteuid() and not info.st_mode & stat.S_ISVTX:
        os.chmod(directory, stat.S_IMODE(info.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
        return
    raise SdkSocketError(
        f"{directory}: writable by other users, who could replace the SDK socket; "
        "give the agent a directory only it can write"
    )


def admission(uid: str, connections: Counter[str], limits: SdkLimits) -> Refusal | None:
    """Why a peer of pod `uid` may not hold one more connection, if it may not."""
    if sum(connections.values()) >= limits.total:
        return Refusal("node-limit", f"the agent serves at most {limits.total} SDK connections")
    if connections[uid] >= limits.per_pod:
        return Refusal(
            "pod-limit", f"pod {uid} already holds {limits.per_pod} SDK connections, the most"
        )
    return None
