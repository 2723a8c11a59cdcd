"""Stopping a pod whole by its cgroup (agent/freezer.py): the pod's folder found under either
driver and either cgroup version, the right file written, and the signal fallback only where
no folder can be frozen. The kernel side runs on the real kubelet (tests/e2e)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gangshare.agent.freezer import (
    CgroupFreezer,
    SignalStopper,
    find_pod_cgroup,
    freezer_hierarchy,
)

UID = "0d9c2a4e-1b2f-4c3d-8e9f-a1b2c3d4e5f6"
SYSTEMD_UID = UID.replace("-", "_")
OTHER = "11111111-2222-3333-4444-555555555555"


class Recorder:
    def __init__(self) -> None:
        self.stopped: list[str] = []
        self.resumed: list[str] = []

    def stop(self, uids: object) -> None:
        self.stopped += list(uids)  # type: ignore[call-overload]

    def resume(self, uids: object) -> None:
        self.resumed += list(uids)  # type: ignore[call-overload]


def v1_tree(root: Path, *pods: str) -> Path:
    """A hybrid host's cgroup mount, as the kubelet's cgroupfs driver lays out pods."""
    (root / "unified").mkdir(parents=True)
    (root / "freezer").mkdir()
    for folder in pods:
        (root / "freezer" / folder).mkdir(parents=True)
        (root / "freezer" / folder / "freezer.state").write_text("THAWED\n")
    return root


def v2_tree(root: Path, *pods: str) -> Path:
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    for folder in pods:
        (root / folder).mkdir(parents=True)
        (root / folder / "cgroup.freeze").write_text("0\n")
        (root / folder / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    return root


@pytest.mark.parametrize(
    "folder",
    [
        f"kubepods/pod{UID}",  # Guaranteed QoS, cgroupfs
        f"kubepods/burstable/pod{UID}",
        f"kubepods/besteffort/pod{UID}",
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice",
        f"kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice",
    ],
)
def test_a_pods_folder_is_found_by_its_uid_under_either_driver(tmp_path: Path, folder: str) -> None:
    root = v2_tree(tmp_path / "cg", f"kubepods/burstable/pod{OTHER}", folder)
    assert find_pod_cgroup(root, UID) == root / folder
    assert find_pod_cgroup(root, "99999999-9999-9999-9999-999999999999") is None


def test_outside_kubepods_nothing_is_searched(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", f"system.slice/pod{UID}")
    assert find_pod_cgroup(root, UID) is None


def test_cgroup_v2_freezes_by_cgroup_freeze(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", f"kubepods/besteffort/pod{UID}")
    assert freezer_hierarchy(root) == (root, 2)
    fallback = Recorder()
    freezer = CgroupFreezer(root, fallback)
    freezer.stop([UID])
    folder = root / "kubepods" / "besteffort" / f"pod{UID}"
    assert (folder / "cgroup.freeze").read_text() == "1" and fallback.stopped == []
    (folder / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert freezer.frozen(UID) is True
    freezer.resume([UID])
    assert (folder / "cgroup.freeze").read_text() == "0"
    # Continued by signal too: a pod an older agent stopped that way is let go as well.
    assert fallback.resumed == [UID]


def test_a_hybrid_host_freezes_through_the_v1_freezer(tmp_path: Path) -> None:
    root = v1_tree(tmp_path / "cg", f"kubepods/burstable/pod{UID}")
    assert freezer_hierarchy(root) == (root / "freezer", 1)
    freezer = CgroupFreezer(root, Recorder())
    freezer.stop([UID])
    state = root / "freezer" / "kubepods" / "burstable" / f"pod{UID}" / "freezer.state"
    assert state.read_text() == "FROZEN"
    assert freezer.frozen(UID) is True
    freezer.resume([UID])
    assert state.read_text() == "THAWED" and freezer.frozen(UID) is False


def test_a_pod_that_cannot_be_frozen_falls_back_to_signals(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = v2_tree(tmp_path / "cg", f"kubepods/pod{UID}")
    fallback = Recorder()
    freezer = CgroupFreezer(root, fallback)
    freezer.stop([UID, OTHER])  # OTHER has no folder on this node
    assert fallback.stopped == [OTHER]
    assert f"pod {OTHER} cannot be frozen" in caplog.text
    nothing = CgroupFreezer(tmp_path / "no-cgroups", fallback)
    nothing.stop([UID])
    assert fallback.stopped == [OTHER, UID] and nothing.frozen(UID) is None


def test_the_signal_fallback_stops_and_continues_every_process_of_the_pod() -> None:
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        if pid == 12:
            raise ProcessLookupError  # gone between the scan and the signal
        sent.append((pid, sig))

    stopper = SignalStopper(lambda: {"o": [10, 11, 12], "g": [20]}, kill)
    stopper.stop(["o"])
    stopper.resume(["o"])
    assert sent == [
        (10, signal.SIGSTOP),
        (11, signal.SIGSTOP),
        (10, signal.SIGCONT),
        (11, signal.SIGCONT),
    ]
