"""Allocate: what a container gets for the device IDs the kubelet chose.

The kubelet never says which pod it is allocating for, so the answer is built from the device
IDs alone: the visible-devices variable, the device files on a real node, default caps for
share slots (the local coordinator moves them later through the agent's socket), and a
read-only mount of the agent's socket folder for the training SDK.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gangshare.agent.backend import GpuInfo
from gangshare.agent.devices import DeviceMap
from gangshare.core.annotations import SHARE_RESOURCE

CONTAINER_SOCKET_DIR = "/var/run/gangshare"
SOCKET_NAME = "agent.sock"
MPS_CONTAINER_DIR = "/var/run/nvidia-mps"


@dataclass(frozen=True)
class ContainerAllocation:
    envs: dict[str, str]
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # container, host, ro
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # container, host, perms


def allocate_container(
    resource: str,
    devices: DeviceMap,
    device_ids: list[str],
    socket_dir: str | None,
    mps_pipe_dir: str | None = None,
) -> ContainerAllocation:
    """The response for one container; DeviceError names any ID this agent never offered."""
    by_index = {}
    for device_id in device_ids:
        gpu = devices.gpu_of(resource, device_id)
        by_index[gpu.index] = gpu
    chosen = [by_index[i] for i in sorted(by_index)]
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in chosen),
        "GANGSHARE_NODE_GPUS": ",".join(str(g.index) for g in chosen),
        "GANGSHARE_DEVICE_RESOURCE": resource,
    }
    if resource == SHARE_RESOURCE:
        slots = devices.share_slots
        envs["GANGSHARE_MEMORY_CAP_MIB"] = str(min(g.memory_mib for g in chosen) // slots)
        envs["GANGSHARE_SM_CAP"] = f"{1 / slots:.4f}"
    mounts = []
    if socket_dir:
        envs["GANGSHARE_AGENT_SOCKET"] = f"{CONTAINER_SOCKET_DIR}/{SOCKET_NAME}"
        mounts.append((CONTAINER_SOCKET_DIR, socket_dir, True))
    if mps_pipe_dir:
        _join_mps(envs, mounts, resource, chosen, devices.share_slots, mps_pipe_dir)
    paths = [p for g in chosen for p in g.device_paths]
    if paths:
        paths.extend(devices.inventory.control_paths)
    return ContainerAllocation(envs, mounts, [(p, p, "rw") for p in paths])


def _join_mps(
    envs: dict[str, str],
    mounts: list[tuple[str, str, bool]],
    resource: str,
    chosen: list[GpuInfo],
    slots: int,
    pipe_dir: str,
) -> None:
    """Where the node runs CUDA MPS, every GPU container is its client; share slots are capped.

    MPS fixes a client's limits when it starts, so these are the slot's static share (its SM
    threads and pinned memory); the coordinator moves the SDK's caps below them at run time.
    A guaranteed container joins too (a GPU under an MPS server serves only its clients), with
    no limit.

    These variables are advisory: the container's entrypoint can unset them, and the driver
    takes per-client limits only from the client's environment (the control daemon sets them
    per server). What holds is outside the container: NVML's per-process samples and memory,
    stop/continue and removal (core/enforcement.py). The pipe folder is mounted read-only: a
    client still connects (the kernel checks no mount flag on sockets and FIFOs), but no tenant
    can replace, remove or add anything in the folder every GPU container shares.
    """
    envs["CUDA_MPS_PIPE_DIRECTORY"] = MPS_CONTAINER_DIR
    mounts.append((MPS_CONTAINER_DIR, pipe_dir, True))
    if resource != SHARE_RESOURCE:
        return
    envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, 100 // slots))
    envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
        f"{i}={g.memory_mib // slots}M" for i, g in enumerate(chosen)
    )
