"""Child processes of the local control plane: start with a log file, stop as a group.

Two lifetimes: `attached` children (test fixtures, `make demo`) die with their
parent even on SIGKILL (PR_SET_PDEATHSIG); `detached` children (`gangshare dev up`)
outlive the CLI and are stopped by `gangshare dev down` from the recorded pids.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on right now, outside the ephemeral range,
    and never one this process handed out before.

    A port from the ephemeral range can be taken by any outgoing connection (the
    API server's to etcd, a client's) between this pick and the component's bind;
    that failed a second `dev up` in CI with EADDRINUSE. Ports picked together are
    bound only later, so two random picks could coincide; CI once gave the extender
    the same port for serving and metrics.
    """
    low, high = _ephemeral_range()
    ranges = [r for r in ((10000, low - 1), (high + 1, 65535)) if r[1] - r[0] > 1000]
    for _ in range(200):
        first, last = random.choice(ranges) if ranges else (1024, 65535)
        port = random.randint(first, last)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    raise OSError("no free loopback port outside the ephemeral range")


def port_is_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Child:
    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie still answers kill(0); /proc tells the truth.
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start(
    name: str, argv: Sequence[str], log_dir: Path, attached: bool, env: dict[str, str] | None = None
) -> Child:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if attached else None,
            env={**os.environ, **(env or {})},
        )
    return Child(name, popen.pid, log, popen)


def stop(children: Sequence[Child], grace_seconds: float = 10.0) -> list[str]:
    """Stop children in reverse start order; returns the names of any that would not die."""
    for child in reversed(children):
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for child in reversed(children):
        while child.alive() and time.monotonic() < deadline:
            if child.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.popen.wait(timeout=0.1)
            else:
                time.sleep(0.1)
        if child.alive():
            _signal_group(child, signal.SIGKILL)
    time.sleep(0.2)
    for child in children:
        if child.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=5)
    return [c.name for c in children if c.alive()]


def _signal_group(child: Child, sig: signal.Signals) -> None:
    # Each child leads its own session, so its group holds anything it forked.
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child.pid, sig)
