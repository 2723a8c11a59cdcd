"""Stopping a pod whole: the kernel freezes its cgroup, rather than the agent signalling PIDs.

Signalling a pod's processes one at a time (a /proc scan, then SIGSTOP per PID) is escaped by
a pod that keeps forking: a child born after the scan runs on, and can SIGCONT the rest. A
frozen cgroup holds every task in it, those forked later included, in one write:
- cgroup v2: `cgroup.freeze` (1 / 0) in the pod's folder of the unified hierarchy;
- cgroup v1: `freezer.state` (FROZEN / THAWED) in the pod's folder of the freezer hierarchy.

The kubelet names the pod's folder after its UID under the `kubepods` tree, with either
driver (cgroupfs: `kubepods/burstable/pod<uid>`; systemd: `kubepods.slice/
kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice`). The folder is
found by name, not from /proc/<pid>/cgroup: inside the agent's own cgroup namespace, another
pod's path reads as a relative one.

Where no folder is found or the write is refused (no freezer hierarchy, a read-only mount),
the pod falls back to signals, with a warning naming it: that fallback is escapable.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Protocol

from gangshare.agent.cgroups import pids_by_pod

log = logging.getLogger("gangshare.agent")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# kubepods/<qos>/pod<uid>, below an optional kubelet cgroupRoot folder: deep enough for both.
_SEARCH_DEPTH = 4
_QOS_FOLDERS = frozenset({"burstable", "besteffort"})


class PodStopper(Protocol):
    def stop(self, uids: Collection[str]) -> None: ...

    def resume(self, uids: Collection[str]) -> None: ...


class SignalStopper:
    """SIGSTOP/SIGCONT to each process of the pods, found by a /proc scan (the fallback)."""

    def __init__(
        self,
        pids: Callable[[], Mapping[str, list[int]]] = pids_by_pod,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.pids = pids
        self.kill = kill

    def stop(self, uids: Collection[str]) -> None:
        self._send(uids, signal.SIGSTOP)

    def resume(self, uids: Collection[str]) -> None:
        self._send(uids, signal.SIGCONT)

    def _send(self, uids: Collection[str], sig: int) -> None:
        if not uids:
            return
        pids = self.pids()
        for uid in uids:
            signal_processes(pids.get(uid, []), sig, self.kill)


def signal_processes(pids: list[int], sig: int, kill: Callable[[int, int], None] = os.kill) -> int:
    """Send `sig` to each process; how many got it (a process gone meanwhile is skipped)."""
    sent = 0
    for pid in pids:
        try:
            kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            continue
    return sent


def freezer_hierarchy(root: Path) -> tuple[Path, int] | None:
    """The hierarchy that freezes under `root` and its cgroup version; None without one.

    A hybrid host (v1 controllers, an empty v2 tree at `unified/`) freezes through v1: the
    kubelet's cgroupfs driver makes pod folders there, not in `unified/`.
    """
    if (root / "cgroup.controllers").exists():
        return root, 2
    if (root / "freezer").is_dir():
        return root / "freezer", 1
    return None


def find_pod_cgroup(hierarchy: Path, uid: str) -> Path | None:
    """The pod's folder in a cgroup hierarchy, searched by name below the `kubepods` folders."""
    plain, underscored = f"pod{uid}", f"pod{uid.replace('-', '_')}"
    frontier = [hierarchy]
    for _ in range(_SEARCH_DEPTH):
        below: list[Path] = []
        for folder in frontier:
            for entry in _subfolders(folder):
                name = entry.name
                if name in (plain, underscored) or name.endswith(f"-{underscored}.slice"):
                    return entry
                if "kubepods" in name or name in _QOS_FOLDERS:
                    below.append(entry)
        frontier = below
    return None


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


class CgroupFreezer:
    """Freezes and thaws pods by cgroup; pods it cannot freeze are signalled instead."""

    def __init__(self, root: Path = CGROUP_ROOT, fallback: PodStopper | None = None) -> None:
        self.found = freezer_hierarchy(root)
        self.fallback = fallback or SignalStopper()
        self._folders: dict[str, Path] = {}
        self._signalled: set[str] = set()  # warned once each
        if self.found is None:
            log.warning(
                "no cgroup freezer under %s: throttled pods are stopped by signals, which a "
                "pod that keeps forking can escape",
                root,
            )
        else:
            log.info(
                "throttled pods are frozen through cgroup v%d at %s", self.found[1], self.found[0]
            )

    def stop(self, uids: Collection[str]) -> None:
        self.fallback.stop([uid for uid in uids if not self._write(uid, frozen=True)])

    def resume(self, uids: Collection[str]) -> None:
        # Both, always: a pod stopped by signals (an older agent, a fallback) is continued too.
        for uid in uids:
            self._write(uid, frozen=False)
        self.fallback.resume(list(uids))

    def frozen(self, uid: str) -> bool | None:
        """Whether the kernel holds the pod frozen now; None where it has no freezer folder."""
        folder = self._folder(uid)
        if folder is None or self.found is None:
            return None
        try:
            if self.found[1] == 2:
                events = (folder / "cgroup.events").read_text().split()
                return events[events.index("frozen") + 1] == "1"
            return (folder / "freezer.state").read_text().strip() == "FROZEN"
        except (OSError, ValueError, IndexError):
            return None

    def _write(self, uid: str, frozen: bool) -> bool:
        folder = self._folder(uid)
        if folder is None or self.found is None:
            self._warn(uid, "no cgroup folder found for it")
            return False
        name, value = (
            ("cgroup.freeze", "1" if frozen else "0")
            if self.found[1] == 2
            else ("freezer.state", "FROZEN" if frozen else "THAWED")
        )
        try:
            (folder / name).write_text(value)
            return True
        except FileNotFoundError:
            self._folders.pop(uid, None)  # the pod is gone, or its folder moved
            return False
        except OSError as err:
            self._warn(uid, f"writing {folder / name} failed: {err}")
            return False

    def _folder(self, uid: str) -> Path | None:
        if self.found is None:
            return None
        folder = self._folders.get(uid)
        if folder is not None and folder.is_dir():
            return folder
        folder = find_pod_cgroup(self.found[0], uid)
        if folder is None:
            self._folders.pop(uid, None)
        else:
            self._folders[uid] = folder
        return folder

    def _warn(self, uid: str, why: str) -> None:
        if uid not in self._signalled:
            self._signalled.add(uid)
            log.warning("pod %s cannot be frozen (%s): stopped by signals instead", uid, why)
