"""The device IDs the agent offers the kubelet, and which GPU each one is.

`nvidia.com/gpu` offers one device per physical GPU, named by its UUID as NVIDIA's own plugin
does, so existing manifests and tools keep working. `gangshare.io/gpu-share` offers a fixed
number of share slots per GPU, `<uuid>::<slot>`; a pod asking for N shares gets one slot on
each of N GPUs (GetPreferredAllocation steers the kubelet to distinct GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from gangshare.agent.backend import GpuInfo, Inventory
from gangshare.core.annotations import GPU_RESOURCE, SHARE_RESOURCE

RESOURCES = (GPU_RESOURCE, SHARE_RESOURCE)
SLOT_SEPARATOR = "::"


class DeviceError(ValueError):
    """A resource or device ID the agent does not serve; the message names it."""


def check_resource(resource: str) -> str:
    if resource not in RESOURCES:
        raise DeviceError(f"unknown resource {resource!r}: the agent serves {', '.join(RESOURCES)}")
    return resource


@dataclass(frozen=True)
class DeviceMap:
    inventory: Inventory
    share_slots: int

    def __post_init__(self) -> None:
        if self.share_slots < 1:
            raise DeviceError(f"share slots: must be at least 1, got {self.share_slots}")

    @cached_property
    def _by_uuid(self) -> dict[str, GpuInfo]:
        # Asked for every device of every kubelet call: build it once, not per lookup.
        return self.inventory.by_uuid()

    def device_ids(self, resource: str) -> list[str]:
        check_resource(resource)
        if resource == GPU_RESOURCE:
            return [g.uuid for g in self.inventory.gpus]
        return [
            slot_id(g.uuid, slot) for g in self.inventory.gpus for slot in range(self.share_slots)
        ]

    def gpu_of(self, resource: str, device_id: str) -> GpuInfo:
        """The GPU a device ID stands for; DeviceError when this agent never offered it."""
        check_resource(resource)
        uuid, slot = device_id, None
        if resource == SHARE_RESOURCE:
            uuid, _, raw = device_id.partition(SLOT_SEPARATOR)
            slot = int(raw) if raw.isdigit() else -1
        gpu = self._by_uuid.get(uuid)
        if gpu is None or (slot is not None and not 0 <= slot < self.share_slots):
            raise DeviceError(f"{resource}: device ID {device_id!r} was never offered on this node")
        return gpu

    def indices(self, resource: str, device_ids: list[str]) -> tuple[int, ...]:
        """The distinct GPU indices behind device IDs, sorted."""
        return tuple(sorted({self.gpu_of(resource, d).index for d in device_ids}))


def slot_id(uuid: str, slot: int) -> str:
    return f"{uuid}{SLOT_SEPARATOR}{slot}"
