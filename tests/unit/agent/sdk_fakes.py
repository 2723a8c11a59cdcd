"""Helpers for the SDK socket's tests: a client end, the agent's refusal, a bounded wait."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

# What the server handed to the coordinator: (pod uid, step times, count).
Got = list[tuple[str, tuple[float, ...], int | None]]


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.settimeout(5)
    return sock


def refusal(sock: socket.socket) -> str:
    """The error the agent sent before it closed the connection."""
    error = json.loads(sock.makefile("rb").readline())["error"]
    assert sock.recv(1) == b""
    return str(error)


def wait_until(what: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.01)
