"""The kubelet's own record of which devices each pod got, keyed by pod UID.

PodResources (v1) names pods by namespace and name only, and a worker of a new attempt
has the same name as its predecessor: read by name, the old pod's GPUs could be written
on the new one while the kubelet still lists the old. The kubelet's device manager
checkpoints every allocation by pod UID (`kubelet_internal_checkpoint` in its
device-plugins folder, beside the plugin sockets the agent serves), so that record tells
the two apart. Its shape (kubelet 1.20 and later):

    {"Data": {"PodDeviceEntries": [{"PodUID": ..., "ContainerName": ..., "ResourceName": ...,
              "DeviceIDs": {"<numa node>": [ids...]}, "AllocResp": ...}],
              "RegisteredDevices": {...}},
     "Checksum": ...}

Older kubelets wrote DeviceIDs as a plain list; both are read. Entries of pods the kubelet
has dropped linger until its next write, which is harmless: nothing else has their UID.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gangshare.agent.devices import RESOURCES

CHECKPOINT_NAME = "kubelet_internal_checkpoint"

# pod UID -> resource -> device IDs (over every container of the pod)
DevicesByUid = dict[str, dict[str, frozenset[str]]]


class CheckpointError(RuntimeError):
    """The kubelet's device checkpoint could not be read; the message says why."""


def parse_device_checkpoint(raw: bytes | str) -> DevicesByUid:
    try:
        doc = json.loads(raw)
        entries = doc["Data"]["PodDeviceEntries"] or []
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"not a device manager checkpoint ({err})") from None
    out: DevicesByUid = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        resource = entry.get("ResourceName")
        uid = entry.get("PodUID")
        if resource not in RESOURCES or not uid:
            continue
        ids = _device_ids(entry.get("DeviceIDs"))
        per_pod = out.setdefault(str(uid), {})
        per_pod[str(resource)] = per_pod.get(str(resource), frozenset()) | ids
    return out


def _device_ids(raw: Any) -> frozenset[str]:
    if isinstance(raw, Mapping):  # per NUMA node (kubelet 1.20+)
        return frozenset(str(i) for ids in raw.values() for i in _ids(ids))
    return frozenset(str(i) for i in _ids(raw))


def _ids(raw: Any) -> Iterable[Any]:
    return raw if isinstance(raw, list) else ()


class DeviceCheckpoint:
    """Reads the checkpoint beside the kubelet's plugin socket when asked."""

    def __init__(self, plugin_dir: Path) -> None:
        self.path = plugin_dir / CHECKPOINT_NAME

    def read(self) -> DevicesByUid:
        try:
            raw = self.path.read_bytes()
        except OSError as err:
            raise CheckpointError(f"{self.path}: {err.strerror or err}") from None
        return parse_device_checkpoint(raw)
