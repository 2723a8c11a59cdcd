"""Host PID -> pod UID through /proc/<pid>/cgroup, under both kubelet cgroup drivers."""

from __future__ import annotations

from pathlib import Path

from gangshare.agent.cgroups import pids_by_pod, pod_uid_in, pod_uid_of

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
