"""Host PIDs to pods and back, through the cgroup every container's processes live in.

The kubelet names a pod's cgroup after its UID, under either driver:
- cgroupfs: `/kubepods/burstable/pod<uid>/<container id>`
- systemd: `.../kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/...`
A PID comes from the kernel (SO_PEERCRED, NVML's process list), so a tenant cannot claim to
be another pod.
"""

from __future__ import annotations

import os
import re
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
