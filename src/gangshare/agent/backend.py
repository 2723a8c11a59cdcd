"""What the agent needs to know about a node's GPUs, whatever reads it (NVML or the fake).

Both backends answer the same questions, so every test without a GPU runs the agent's real
code: the inventory (with NVLink links as a matrix the core turns into islands), live samples,
per-process memory and SM time, and health events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from gangshare.core.gpu import Gpu
from gangshare.core.topology import Island, islands_from_link_matrix

# XIDs that an application causes (bad memory access, illegal instruction, ...): they say
# nothing about the GPU, so they do not mark it unhealthy (the list NVIDIA's plugin skips).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class _HasPid(Protocol):
    @property
    def pid(self) -> int: ...


T = TypeVar("T", bound=_HasPid)


class BackendError(RuntimeError):
    """The GPU backend cannot be read (NVML missing, a bad fake spec); the message says why."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory_mib: int
    # Device files a container needs for this GPU (real NVML: /dev/nvidiaN); none for the fake.
    device_paths: tuple[str, ...] = ()

    def as_gpu(self, healthy: bool) -> Gpu:
        return Gpu(self.index, self.uuid, self.model, self.memory_mib, healthy)


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GpuInfo, ...]
    # links[i][j] > 0 when GPUs i and j talk over NVLink (directly or through an NVSwitch).
    links: tuple[tuple[int, ...], ...]
    # Device files every GPU container needs (nvidiactl, nvidia-uvm) on a real node.
    control_paths: tuple[str, ...] = ()

    def islands(self) -> tuple[Island, ...]:
        return islands_from_link_matrix(self.links)

    def by_uuid(self) -> dict[str, GpuInfo]:
        return {g.uuid: g for g in self.gpus}


@dataclass(frozen=True)
class GpuSample:
    index: int
    sm: float  # SM utilization 0..1 over the backend's last sample period
    memory_used_mib: int


@dataclass(frozen=True)
class GpuProcess:
    index: int
    pid: int  # a host PID
    memory_mib: int
    # The process's SM share 0..1 since the last read (NVML's per-process samples); None
    # where the GPU gives none. Measured by the driver, so the tenant cannot forge it.
    sm: float | None = None


def merged_processes(compute: list[T], mps: list[T]) -> list[T]:
    """One GPU's processes from NVML's two lists (anything with a `pid`), each process once.

    Under CUDA MPS, the compute list names only the MPS server: each client process is in
    the MPS list (nvmlDeviceGetMPSComputeRunningProcesses) alone. Reading one list would
    show no tenant at all on an MPS node, so its memory and SM judgement would see nobody.
    """
    seen: dict[int, T] = {}
    for process in [*compute, *mps]:
        seen.setdefault(int(process.pid), process)
    return list(seen.values())


@dataclass(frozen=True)
class HealthEvent:
    index: int
    reason: str  # e.g. "XID 79" or "GPU is lost"


class GpuBackend(Protocol):
    def inventory(self) -> Inventory: ...

    def samples(self) -> list[GpuSample]: ...

    def processes(self) -> list[GpuProcess]: ...

    def health_events(self, wait_seconds: float) -> list[HealthEvent]:
        """Events since the last call, waiting up to wait_seconds for the first one."""
        ...

    def close(self) -> None: ...


def is_critical_xid(xid: int) -> bool:
    return xid not in APPLICATION_XIDS
