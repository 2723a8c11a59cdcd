"""The truth, read back: the GPUs the kubelet really gave each pod, written on the pod.

`detect_assignments` is pure: from PodResources, the kubelet's device checkpoint and the API
server's pods on this node it says which pods' `gangshare.io/assigned-gpus` must be written,
and whether the kubelet's choice differs from the plan the operator or extender recorded (that
gets an event on the pod).

A pod is matched by UID, never by name alone: a new attempt's worker has its predecessor's
name, and PodResources (which knows only names) may still list the old pod. The checkpoint
(agent/checkpoint.py) says which devices this UID got; they are written only when PodResources
lists the same devices under the pod's name, so the kubelet's two records agree.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gangshare.agent.checkpoint import DevicesByUid
from gangshare.agent.devices import DeviceError, DeviceMap
from gangshare.agent.podresources import PodDevices
from gangshare.core.annotations import (
    POD_ASSIGNED_GPUS,
    POD_PLANNED_GPUS,
    AnnotationError,
    decode_gpu_indices,
    encode_gpu_indices,
)

log = logging.getLogger("gangshare.agent")

DIFFERS_FROM_PLAN = "GpuAssignmentDiffersFromPlan"


@dataclass(frozen=True)
class Assignment:
    namespace: str
    name: str
    uid: str
    indices: tuple[int, ...]
    planned: tuple[int, ...] | None

    @property
    def differs_from_plan(self) -> bool:
        return self.planned is not None and self.planned != self.indices

    def event_message(self) -> str:
        planned = encode_gpu_indices(self.planned or ())
        return (
            f"the kubelet assigned GPUs {encode_gpu_indices(self.indices)}; "
            f"the plan recorded {planned}; the assignment is what counts from now on"
        )


def _annotation(pod: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(key)
    if raw is None:
        return None
    try:
        return decode_gpu_indices(key, raw)
    except AnnotationError:
        return None


def detect_assignments(
    devices: DeviceMap,
    kubelet: Mapping[tuple[str, str], PodDevices],
    pods: Sequence[Mapping[str, Any]],
    by_uid: DevicesByUid | None,
) -> list[Assignment]:
    """Pods whose recorded assignment is missing or differs from what the kubelet handed out.
    `by_uid`: the kubelet's checkpoint; None when it cannot be read (then names alone decide,
    as on a kubelet that keeps no checkpoint)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        held = kubelet.get((meta.get("namespace", ""), meta.get("name", "")))
        if held is None:
            continue
        if by_uid is not None and not same_devices(by_uid.get(str(meta.get("uid", ""))), held):
            continue  # the name's devices are another pod's (or not checkpointed yet)
        try:
            held_gpus = {i for r, ids in held.devices.items() for i in devices.indices(r, [*ids])}
            indices = tuple(sorted(held_gpus))
        except DeviceError as err:
            log.warning("%s/%s: %s", held.namespace, held.name, err)
            continue
        if _annotation(pod, POD_ASSIGNED_GPUS) == indices:
            continue
        out.append(
            Assignment(
                held.namespace,
                held.name,
                str(meta.get("uid", "")),
                indices,
                _annotation(pod, POD_PLANNED_GPUS),
            )
        )
    return out


def same_devices(checkpointed: Mapping[str, frozenset[str]] | None, listed: PodDevices) -> bool:
    """Whether the checkpoint's devices for a UID are the ones PodResources lists by name."""
    if not checkpointed:
        return False
    return {r: frozenset(ids) for r, ids in listed.devices.items()} == {
        r: ids for r, ids in checkpointed.items() if ids
    }


KubeletKey = tuple[str, str, str, tuple[tuple[str, tuple[str, ...]], ...]]


def kubelet_keys(
    kubelet: Mapping[tuple[str, str], PodDevices], by_uid: DevicesByUid | None
) -> set[KubeletKey]:
    """What the kubelet holds, as (namespace, name, pod UID, devices): a pod of a reused name
    is a new key even when it got the same devices. Without a checkpoint the UID is ''."""
    keys: set[KubeletKey] = set()
    for (namespace, name), held in kubelet.items():
        devices = tuple(sorted((r, tuple(sorted(ids))) for r, ids in held.devices.items()))
        if by_uid is None:
            keys.add((namespace, name, "", devices))
            continue
        for uid, checkpointed in by_uid.items():
            if same_devices(checkpointed, held):
                keys.add((namespace, name, uid, devices))
    return keys
