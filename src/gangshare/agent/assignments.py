"""The truth, read back: the GPUs the kubelet really gave each pod, written on the pod.

`detect_assignments` is pure: from PodResources and the API server's pods on this node it says
which pods' `gangshare.io/assigned-gpus` must be written, and whether the kubelet's choice
differs from the plan the operator or extender recorded (that gets an event on the pod).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
) -> list[Assignment]:
    """Pods whose recorded assignment is missing or differs from what the kubelet handed out."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        held = kubelet.get((meta.get("namespace", ""), meta.get("name", "")))
        if held is None:
            continue
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
