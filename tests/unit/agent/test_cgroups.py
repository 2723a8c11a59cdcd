"""Host PID -> pod UID through /proc/<pid>/cgroup, under both kubelet cgroup drivers."""

from __future__ import annotations

import os
from pathlib import Path

from gangshare.agent.cgroups import (
    PidPods,
    ProcessId,
    pids_by_pod,
    pod_of_process,
    pod_uid_in,
    pod_uid_of,
    start_time_of,
    ticks_since_boot,
)

UID = "4b0c3e7a-1f2d-4c5b-9a8e-0123456789ab"
CGROUPFS = f"""12:freezer:/kubepods/besteffort/pod{UID}/3f2a9c
11:memory:/kubepods/besteffort/pod{UID}/3f2a9c
0::/
"""
SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-3f2a9c.scope\n"
)


def test_both_cgroup_drivers_name_the_pod() -> None:
    assert pod_uid_in(CGROUPFS) == UID
    assert pod_uid_in(SYSTEMD) == UID


def test_a_process_outside_any_pod_has_none() -> None:
    assert pod_uid_in("0::/user.slice/user-0.slice/session-1.scope\n") is None
    # A pod-looking name outside kubepods is not a pod.
    assert pod_uid_in(f"0::/system.slice/pod{UID}.scope\n") is None


def test_pids_are_grouped_by_pod_from_a_proc_tree(tmp_path: Path) -> None:
    for pid, text in ((10, CGROUPFS), (11, SYSTEMD), (12, "0::/\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    (tmp_path / "self").mkdir()
    assert {u: sorted(p) for u, p in pids_by_pod(tmp_path).items()} == {UID: [10, 11]}
    assert pod_uid_of(12, tmp_path) is None
    assert pod_uid_of(99, tmp_path) is None


OTHER = "9f8e7d6c-5b4a-4c3d-8e2f-fedcba987654"


def write_process(proc: Path, pid: int, start: int, uid: str) -> None:
    (proc / str(pid)).mkdir(exist_ok=True)
    fields = ["R", *["0"] * 18, str(start), *["0"] * 10]
    # A command name may hold spaces and ')': the start time is counted after the last ')'.
    (proc / str(pid) / "stat").write_text(f"{pid} (a) b (c) {' '.join(fields)}\n")
    (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/c1\n")


def test_a_process_start_time_is_field_22_of_its_stat(tmp_path: Path) -> None:
    write_process(tmp_path, 42, 123456, UID)
    assert start_time_of(42, tmp_path) == 123456
    assert start_time_of(43, tmp_path) is None
    me = start_time_of(os.getpid())
    assert me is not None and 0 < me <= ticks_since_boot()


def test_a_cached_pid_the_kernel_gave_to_another_pod_is_charged_to_that_pod(
    tmp_path: Path,
) -> None:
    pods = PidPods(proc=tmp_path)
    write_process(tmp_path, 42, 500, UID)
    assert pods.pod_of(42) == UID
    write_process(tmp_path, 42, 900, OTHER)  # pod A's process exited; pod B's got PID 42
    assert pods.pod_of(42) == OTHER
    (tmp_path / "42" / "stat").unlink()  # and exited too
    assert pods.pod_of(42) is None


def test_a_pid_reused_while_its_cgroup_is_read_names_no_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 42, 500, UID)

    def read_as_the_pid_is_reused(pid: int) -> str | None:
        uid = pod_uid_of(pid, tmp_path)
        write_process(tmp_path, 42, 900, OTHER)
        return uid

    assert pod_of_process(ProcessId(42, 500), read_as_the_pid_is_reused, tmp_path) is None
    assert pod_of_process(ProcessId(42, 900), lambda pid: pod_uid_of(pid, tmp_path), tmp_path) == (
        OTHER
    )
