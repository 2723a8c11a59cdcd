"""The NVML backend's reading of the library, against a stand-in for pynvml (no GPU here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gangshare.agent.backend import BackendError, GpuProcess, GpuSample, HealthEvent
from gangshare.agent.nvml import NvmlBackend

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class FakePynvml:
    """Two islands of two GPUs; GPU 3 can be lost; XID events are queued by the test."""

    NVMLError = NVMLError
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.lost: set[int] = set()
        self.events: list[tuple[int, int]] = []
        self.shut = False
        # GPU 1's driver samples per process (pid, microsecond timestamp, SM %); GPU 0 none.
        self.process_samples = [(1001, 10, 80), (1001, 20, 100)]
        self.asked_since: list[int] = []

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return h

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        if h in self.lost:
            raise NVMLError_GpuIsLost()
        return SimpleNamespace(total=81559 * MIB, used=(h + 1) * 1000 * MIB)

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        return 0 if a // 2 == b // 2 else 4

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=25 * h, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=1000 + h, usedGpuMemory=512 * MIB)] if h == 1 else []

    def nvmlDeviceGetProcessUtilization(self, h: int, since: int) -> list[Any]:
        if h == 0:
            raise NVMLError_NotSupported()
        if h != 1:
            raise NVMLError_NotFound()
        self.asked_since.append(since)
        fresh = [s for s in self.process_samples if s[1] > since]
        if not fresh:
            raise NVMLError_NotFound()
        return [SimpleNamespace(pid=p, timeStamp=t, smUtil=sm, memUtil=0) for p, t, sm in fresh]

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, events: str) -> None:
        return None

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.events:
            raise NVMLError_Timeout()
        device, xid = self.events.pop(0)
        return SimpleNamespace(device=device, eventData=xid)

    def nvmlEventSetFree(self, events: str) -> None:
        return None


def test_inventory_links_and_live_state_are_read_from_nvml() -> None:
    nvml = FakePynvml()
    backend = NvmlBackend(nvml)
    inventory = backend.inventory()
    assert [g.uuid for g in inventory.gpus] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert inventory.gpus[0].model == "NVIDIA-H100-80GB-HBM3"
    assert inventory.gpus[0].memory_mib == 81559
    assert inventory.gpus[2].device_paths == ("/dev/nvidia2",)
    assert inventory.islands() == ((0, 1), (2, 3))
    assert backend.samples()[2] == GpuSample(2, 0.5, 3000)
    assert backend.processes() == [GpuProcess(1, 1001, 512, 0.9)]
    backend.close()
    assert nvml.shut


def test_critical_xids_and_lost_gpus_are_health_events_application_xids_are_not() -> None:
    nvml = FakePynvml()
    backend = NvmlBackend(nvml)
    assert backend.health_events(0.01) == []
    nvml.events = [(1, 13), (2, 79)]
    assert backend.health_events(0.01) == []  # XID 13: the application's fault
    assert backend.health_events(0.01) == [HealthEvent(2, "XID 79")]
    nvml.lost.add(3)
    assert backend.health_events(0.01) == [HealthEvent(3, "GPU is lost")]
    assert [s.index for s in backend.samples()] == [0, 1, 2]


def test_nvml_that_will_not_start_is_a_clear_error() -> None:
    with pytest.raises(BackendError, match="NVML: cannot initialise"):
        NvmlBackend(FakePynvml(fail_init=True))


def test_per_process_sm_is_read_from_the_drivers_samples_since_the_last_read() -> None:
    """What an opportunistic pod is judged by: the driver's samples, not its SDK's word."""
    nvml = FakePynvml()
    backend = NvmlBackend(nvml)
    assert [p.sm for p in backend.processes()] == [0.9]
    # Nothing ran since: a process that ran no kernel is idle, not unknown.
    assert [p.sm for p in backend.processes()] == [0.0]
    assert nvml.asked_since == [0, 20]
    nvml.process_samples.append((1001, 30, 40))
    assert [p.sm for p in backend.processes()] == [0.4]


def test_a_gpu_without_per_process_samples_gives_unknown_not_idle() -> None:
    nvml = FakePynvml()
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: (  # type: ignore[method-assign]
        [SimpleNamespace(pid=1000 + h, usedGpuMemory=512 * MIB)] if h < 2 else []
    )
    backend = NvmlBackend(nvml)
    first = backend.processes()
    assert [(p.index, p.sm) for p in first] == [(0, None), (1, 0.9)]
    assert [(p.index, p.sm) for p in backend.processes()] == [(0, None), (1, 0.0)]


def test_mps_clients_are_read_from_nvmls_mps_list_beside_the_compute_list() -> None:
    """Under MPS the compute list names only the MPS server; each client is in the MPS list
    alone. Read both, each process once, with its own memory and SM samples."""
    nvml = FakePynvml()
    server = SimpleNamespace(pid=900, usedGpuMemory=64 * MIB)
    clients = [
        SimpleNamespace(pid=1001, usedGpuMemory=4096 * MIB),
        SimpleNamespace(pid=1002, usedGpuMemory=None),  # some drivers hide it under MPS
    ]
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [server] if h == 1 else []  # type: ignore[method-assign]
    nvml.nvmlDeviceGetMPSComputeRunningProcesses = (  # type: ignore[attr-defined]
        lambda h: [*clients, server] if h == 1 else []
    )
    listed = NvmlBackend(nvml).processes()
    assert [(p.index, p.pid, p.memory_mib, p.sm) for p in listed] == [
        (1, 900, 64, 0.0),
        (1, 1001, 4096, 0.9),
        (1, 1002, 0, 0.0),
    ]


def test_a_gpu_that_refuses_the_mps_list_still_gives_its_compute_list() -> None:
    nvml = FakePynvml()

    def refused(h: int) -> list[Any]:
        raise NVMLError_NotSupported()

    nvml.nvmlDeviceGetMPSComputeRunningProcesses = refused  # type: ignore[attr-defined]
    assert [(p.index, p.pid) for p in NvmlBackend(nvml).processes()] == [(1, 1001)]
