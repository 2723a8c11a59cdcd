"""The SDK socket's bounds (agent/sdkserver.py): connections per pod and per node, step times
held per pod, accept failures that must not spin, and a directory only the agent may write."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sdk_fakes import Got, connect, refusal, wait_until

from gangshare.agent.sdklimits import SdkLimits, SdkSocketError
from gangshare.agent.sdkserver import SdkServer
from gangshare.sdk.wire import WireCaps, encode, steps_message

ME = os.getpid()
# A peer in another process: connects, says it is there, prints what the agent sends.
PEER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.settimeout(10)
print("connected", flush=True)
print(s.recv(4096).decode(), flush=True)
"""


def pod_a_or_b(pid: int) -> str:
    """This test process is pod a; any other process is pod b."""
    return "pod-a" if pid == ME else "pod-b"


@contextmanager
def serving(
    tmp_path: Path,
    limits: SdkLimits,
    pod_of_pid: Callable[[int], str | None] = pod_a_or_b,
    listener: socket.socket | None = None,
) -> Iterator[tuple[SdkServer, Got]]:
    got: Got = []
    server = SdkServer(
        tmp_path / "sdk" / "agent.sock",
        pod_of_pid,
        lambda uid, steps, count: got.append((uid, steps, count)),
        lambda uid: None,
        limits,
    )
    server.start(listener)
    try:
        yield server, got
    finally:
        server.stop()


def test_a_pod_over_its_connection_limit_is_refused_while_another_pod_still_connects(
    tmp_path: Path,
) -> None:
    with serving(tmp_path, SdkLimits(per_pod=2, total=8)) as (server, _):
        flood = [connect(server.path) for _ in range(6)]
        wait_until(lambda: server.refused["pod-limit"] == 4)
        assert server.connected() == {"pod-a": 2}
        errors = [refusal(s) for s in flood[2:]]
        assert all("pod pod-a already holds 2 SDK connections" in e for e in errors)
        peer = subprocess.Popen(
            [sys.executable, "-c", PEER, str(server.path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert peer.stdout is not None and peer.stdout.readline() == "connected\n"
            wait_until(lambda: server.connected() == {"pod-a": 2, "pod-b": 1})
            server.push("pod-b", WireCaps(0.25, 100, 7))
            assert json.loads(peer.stdout.readline())["caps"]["generation"] == 7
        finally:
            peer.kill()
            peer.wait()
        for sock in flood:
            sock.close()


def test_the_node_wide_connection_limit_holds_whatever_the_pod(tmp_path: Path) -> None:
    with serving(tmp_path, SdkLimits(per_pod=10, total=3)) as (server, _):
        socks = [connect(server.path) for _ in range(4)]
        wait_until(lambda: server.refused["node-limit"] == 1)
        assert server.connected() == {"pod-a": 3}
        assert "at most 3 SDK connections" in refusal(socks[3])
        for sock in socks:
            sock.close()


def test_a_peer_not_in_a_pod_is_refused(tmp_path: Path) -> None:
    with serving(tmp_path, SdkLimits(), pod_of_pid=lambda pid: None) as (server, _):
        sock = connect(server.path)
        assert f"process {ME} is not in a pod" in refusal(sock)
        assert server.refused["not-in-pod"] == 1
        sock.close()


def test_a_message_flood_keeps_only_the_newest_steps_of_the_pod(tmp_path: Path) -> None:
    # No flush during the test: everything the flood sent waits in the pod's inbox.
    limits = SdkLimits(pending_steps=300, flush_seconds=3600)
    with serving(tmp_path, limits) as (server, got):
        sock = connect(server.path)
        reports = 100
        for i in range(reports):
            sock.sendall(steps_message([0.01 + i / 1000] * 256, i + 1))

        def received() -> int:
            box = server.inbox("pod-a")
            return 0 if box is None else box.received

        wait_until(lambda: received() == reports * 256)
        box = server.inbox("pod-a")
        assert box is not None
        assert (len(box.steps), box.dropped) == (300, reports * 256 - 300)
        assert got == []  # nothing reached the coordinator past the inbox
        server.flush()
        assert len(got) == 1
        uid, steps, count = got[0]
        assert (uid, len(steps), count) == ("pod-a", 300, reports)
        assert steps[-1] == pytest.approx(0.01 + (reports - 1) / 1000)  # the newest are kept
        sock.close()


def test_steps_reach_the_coordinator_on_their_own_every_flush(tmp_path: Path) -> None:
    with serving(tmp_path, SdkLimits(flush_seconds=0.05)) as (server, got):
        sock = connect(server.path)
        sock.sendall(encode({"steps": [0.2, 0.3], "count": 2}))
        wait_until(lambda: got)
        assert got == [("pod-a", (0.2, 0.3), 2)]
        sock.close()


class FailingListener(socket.socket):
    """A listening socket that stays readable while accept fails, as under EMFILE."""

    def __init__(self, failures: int) -> None:
        super().__init__(socket.AF_UNIX, socket.SOCK_STREAM)
        self.failures = failures
        self.accepts = 0

    def accept(self) -> tuple[socket.socket, Any]:
        self.accepts += 1
        if self.accepts <= self.failures:
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def failing_listener(path: Path, failures: int) -> FailingListener:
    listener = FailingListener(failures)
    listener.bind(str(path))
    listener.listen(8)
    return listener


def test_accept_failing_with_emfile_pauses_instead_of_spinning(tmp_path: Path) -> None:
    listener = failing_listener(tmp_path / "emfile.sock", failures=10**9)
    client = connect(tmp_path / "emfile.sock")  # pending for good: the listener stays ready
    limits = SdkLimits(accept_pause_seconds=0.2)
    cpu = time.process_time()
    with serving(tmp_path, limits, listener=listener) as (server, _):
        time.sleep(1.0)
        tries, pauses = listener.accepts, server.accept_pauses
    cpu = time.process_time() - cpu
    assert 2 <= tries <= 8  # one try per pause, not one per loop
    assert pauses == tries
    assert cpu < 0.4
    client.close()


def test_accepting_resumes_once_descriptors_are_free_again(tmp_path: Path) -> None:
    listener = failing_listener(tmp_path / "emfile.sock", failures=3)
    client = connect(tmp_path / "emfile.sock")
    with serving(tmp_path, SdkLimits(accept_pause_seconds=0.05), listener=listener) as (
        server,
        _,
    ):
        wait_until(lambda: server.connected() == {"pod-a": 1})
        assert server.accept_pauses == 3
    client.close()


def test_the_socket_directory_is_the_agents_alone(tmp_path: Path) -> None:
    (tmp_path / "sdk").mkdir()
    os.chmod(tmp_path / "sdk", 0o777)
    with serving(tmp_path, SdkLimits()) as (server, _):
        # The agent's own directory: tightened so no one else can replace the socket.
        assert os.stat(server.path.parent).st_mode & 0o777 == 0o755
        assert os.stat(server.path).st_mode & 0o777 == 0o666
    sticky = tmp_path / "tmp-like"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    server = SdkServer(sticky / "agent.sock", pod_a_or_b, lambda *_: None, lambda uid: None)
    with pytest.raises(SdkSocketError, match="writable by other users"):
        server.start()
