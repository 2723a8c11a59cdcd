"""A PID the kernel reuses is never taken for the process that held it before: the SDK
socket's peer and the control loop's PID -> pod cache both know a process by (PID, start
time) (agent/cgroups.py, sdkserver.py, control_loop.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sdk_fakes import Got, connect, refusal, wait_until

from gangshare.agent.cgroups import pod_uid_of
from gangshare.agent.control_loop import ControlLoop
from gangshare.agent.sdklimits import SdkLimits
from gangshare.agent.sdkserver import SdkServer
from gangshare.sdk.wire import encode

POD_A = "aaaaaaaa-0000-4000-8000-000000000001"
POD_B = "bbbbbbbb-0000-4000-8000-000000000002"
ME = os.getpid()


def fake_process(proc: Path, pid: int, start: int, pod: str | None) -> None:
    """/proc/<pid> as the kernel shows it: stat (start time is field 22) and cgroup."""
    folder = proc / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    fields = ["S", *["0"] * 18, str(start), *["0"] * 10]
    (folder / "stat").write_text(f"{pid} (py (x) y) {' '.join(fields)}\n")
    cgroup = f"0::/kubepods/besteffort/pod{pod}/c0ffee\n" if pod else "0::/\n"
    (folder / "cgroup").write_text(cgroup)


@contextmanager
def serving(tmp_path: Path, got: Got, boot_ticks: int) -> Iterator[SdkServer]:
    """The agent's SDK server on a fake /proc, started, and stopped after."""
    proc = tmp_path / "proc"
    server = SdkServer(
        tmp_path / "sdk" / "agent.sock",
        lambda pid: pod_uid_of(pid, proc),
        lambda uid, steps, count: got.append((uid, steps, count)),
        lambda uid: None,
        SdkLimits(flush_seconds=0.05),
        proc=proc,
        boot_ticks=lambda: boot_ticks,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_connection_whose_peer_pid_was_reused_is_closed_and_counts_for_no_pod(
    tmp_path: Path,
) -> None:
    got: Got = []
    fake_process(tmp_path / "proc", ME, start=50, pod=POD_A)
    with serving(tmp_path, got, boot_ticks=100) as server:
        sdk = connect(server.path)
        wait_until(lambda: server.connected() == {POD_A: 1})
        # The peer exits (a forked child keeps the socket) and pod B's new process gets its PID.
        fake_process(tmp_path / "proc", ME, start=120, pod=POD_B)
        sdk.sendall(encode({"steps": [0.2], "count": 1}))
        assert "gone or its PID was reused" in refusal(sdk)
        time.sleep(0.1)  # two flushes
        assert got == []
        assert server.connected() == {}
        assert server.refused["peer-gone"] == 1
        sdk.close()


def test_a_pid_reused_before_the_agent_accepted_is_refused(tmp_path: Path) -> None:
    got: Got = []
    # The process now at the peer's PID started after the agent accepted: not the peer.
    fake_process(tmp_path / "proc", ME, start=150, pod=POD_B)
    with serving(tmp_path, got, boot_ticks=100) as server:
        sdk = connect(server.path)
        assert "started after it connected" in refusal(sdk)
        assert server.connected() == {}
        sdk.close()


def test_the_same_peer_keeps_its_pod(tmp_path: Path) -> None:
    got: Got = []
    fake_process(tmp_path / "proc", ME, start=50, pod=POD_A)
    with serving(tmp_path, got, boot_ticks=100) as server:
        sdk = connect(server.path)
        sdk.sendall(encode({"steps": [0.2], "count": 1}))
        wait_until(lambda: got)
        assert got == [(POD_A, (0.2,), 1)]
        sdk.sendall(b"not json\n")
        assert "not JSON" in json.loads(sdk.makefile("rb").readline())["error"]
        sdk.close()


def control_loop(pod_of_pid: Any) -> ControlLoop:
    """Only the PID -> pod cache is used: the rest of the loop is never called."""
    unused = cast(Any, None)
    return ControlLoop(unused, unused, unused, unused, None, None, unused, pod_of_pid=pod_of_pid)


def test_the_control_loop_charges_no_pod_for_a_pid_whose_process_is_gone() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        loop = control_loop({child.pid: "pod-a"}.get)
        assert loop.pod_of_pid(child.pid) == "pod-a"
    finally:
        child.kill()
        child.wait()
    # Cached within the minute before; the process behind the PID is gone now.
    assert loop.pod_of_pid(child.pid) is None
