"""Host PIDs to pods and back, through the cgroup every container's processes live in.

The kubelet names a pod's cgroup after its UID, under either driver:
- cgroupfs: `/kubepods/burstable/pod<uid>/<container id>`
- systemd: `.../kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/...`
A PID comes from the kernel (SO_PEERCRED, NVML's process list), so a tenant cannot claim to
be another pod. A PID alone names a process only until the kernel reuses it; (PID, start time)
names it for good, so anything remembered about a PID is remembered with its start time.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_HEX = "[0-9a-fA-F]"
_POD = re.compile(rf"pod({_HEX}{{8}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{12}})")


def pod_uid_in(cgroup_text: str) -> str | None:
    """The pod UID named in a /proc/<pid>/cgroup file's text, if the process is in a pod."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        found = _POD.findall(path)
        if found:
            return str(found[-1]).replace("_", "-").lower()
    return None


def pod_uid_of(pid: int, proc: Path = PROC) -> str | None:
    try:
        return pod_uid_in((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None


def pids_by_pod(proc: Path = PROC) -> dict[str, list[int]]:
    """Every pod UID with processes on this host -> their PIDs (one pass over /proc)."""
    out: dict[str, list[int]] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        uid = pod_uid_of(int(entry.name), proc)
        if uid is not None:
            out.setdefault(uid, []).append(int(entry.name))
    return out


@dataclass(frozen=True)
class ProcessId:
    """One process for good: the kernel reuses a PID, never a PID with the same start time."""

    pid: int
    start: int  # clock ticks after boot: field 22 of /proc/<pid>/stat


def start_time_of(pid: int, proc: Path = PROC) -> int | None:
    """When the process now holding `pid` started; None when no process holds it."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and ')': fields 3.. follow the last ')'.
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[22 - 3])
    except (IndexError, ValueError):
        return None


def process_id(pid: int, proc: Path = PROC) -> ProcessId | None:
    start = start_time_of(pid, proc)
    return None if start is None else ProcessId(pid, start)


def ticks_since_boot() -> int:
    """Now, on the clock /proc/<pid>/stat dates processes by: no peer can start later."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def pod_of_process(
    process: ProcessId,
    pod_of_pid: Callable[[int], str | None],
    proc: Path = PROC,
) -> str | None:
    """The pod of exactly this process; None if it is gone or its PID is someone else's now.

    The cgroup is read between two looks at the start time: a PID reused in between is seen.
    """
    if start_time_of(process.pid, proc) != process.start:
        return None
    uid = pod_of_pid(process.pid)
    if start_time_of(process.pid, proc) != process.start:
        return None
    return uid


class PidPods:
    """PID -> pod UID, cached per process: a PID the kernel reused is looked up afresh.

    NVML names processes by PID only, so each look checks the start time (one small read)
    before trusting what is cached; a PID with no process behind it belongs to no pod.
    """

    def __init__(
        self,
        pod_of_pid: Callable[[int], str | None] | None = None,
        proc: Path = PROC,
        limit: int = 4096,
    ) -> None:
        self.proc = proc
        self.limit = limit
        self._pod_of_pid = pod_of_pid or (lambda pid: pod_uid_of(pid, proc))
        self._cache: dict[int, tuple[int, str | None]] = {}  # pid -> (start time, pod uid)

    def pod_of(self, pid: int) -> str | None:
        start = start_time_of(pid, self.proc)
        if start is None:
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == start:
            return cached[1]
        uid = pod_of_process(ProcessId(pid, start), self._pod_of_pid, self.proc)
        if len(self._cache) >= self.limit:
            self._cache.clear()
        self._cache[pid] = (start, uid)
        return uid

    def clear(self) -> None:
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._cache)
