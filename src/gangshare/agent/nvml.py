"""The GPU backend on a real node: NVML through nvidia-ml-py (imported as pynvml).

NVML observes; it does not cap anything. This module only reads: the inventory, NVLink
reachability (peer-to-peer over NVLink, which also covers GPUs joined by an NVSwitch), live
utilization, per-process memory and SM samples (host PIDs), and critical XID events.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from gangshare.agent.backend import (
    BackendError,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HealthEvent,
    Inventory,
    is_critical_xid,
    merged_processes,
)

MIB = 1024 * 1024
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as err:  # pragma: no cover - nvidia-ml-py is a dependency
                raise BackendError(f"NVML: nvidia-ml-py is not installed ({err})") from None
            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise BackendError(
                f"NVML: cannot initialise ({err}); is the NVIDIA driver installed and is "
                "libnvidia-ml.so.1 visible to the agent?"
            ) from None
        self.handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]
        self._inventory = self._read_inventory()
        self._events = self._register_events()
        # Per GPU: the newest process sample read (NVML's microsecond timestamp), so each read
        # returns only what ran since; GPUs that give no per-process samples are remembered.
        self._seen: dict[int, int] = {}
        self._no_samples: set[int] = set()

    # ----- inventory ---------------------------------------------------------------------

    def _read_inventory(self) -> Inventory:
        nvml = self.nvml
        gpus = []
        for index, handle in enumerate(self.handles):
            try:
                minor = nvml.nvmlDeviceGetMinorNumber(handle)
                paths: tuple[str, ...] = (f"/dev/nvidia{minor}",)
            except nvml.NVMLError:
                paths = ()
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)).replace(" ", "-"),
                    memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total // MIB),
                    device_paths=paths,
                )
            )
        control = tuple(p for p in CONTROL_DEVICES if os.path.exists(p))
        return Inventory(tuple(gpus), self._read_links(), control)

    def _read_links(self) -> tuple[tuple[int, ...], ...]:
        nvml = self.nvml
        count = len(self.handles)
        matrix = [[0] * count for _ in range(count)]
        nvlink = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
        ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
        if nvlink is None:
            return tuple(tuple(row) for row in matrix)
        for a in range(count):
            for b in range(a + 1, count):
                try:
                    status = nvml.nvmlDeviceGetP2PStatus(self.handles[a], self.handles[b], nvlink)
                except nvml.NVMLError:
                    continue
                if status == ok:
                    matrix[a][b] = matrix[b][a] = 1
        return tuple(tuple(row) for row in matrix)

    def inventory(self) -> Inventory:
        return self._inventory

    # ----- live state --------------------------------------------------------------------

    def samples(self) -> list[GpuSample]:
        nvml = self.nvml
        out = []
        for index, handle in enumerate(self.handles):
            try:
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError:
                continue  # a lost GPU shows up as a health event, not as a zero sample
            out.append(GpuSample(index, min(1.0, rates.gpu / 100.0), int(memory.used // MIB)))
        return out

    def processes(self) -> list[GpuProcess]:
        out = []
        for index, handle in enumerate(self.handles):
            compute = self._listed(handle, "nvmlDeviceGetComputeRunningProcesses")
            mps = self._listed(handle, "nvmlDeviceGetMPSComputeRunningProcesses")
            if compute is None and mps is None:
                continue
            # Read once per GPU: each read takes the samples since the last one.
            busy = self._sm_by_pid(index, handle)
            for process in merged_processes(compute or [], mps or []):
                pid = int(process.pid)
                sm = None if busy is None else busy.get(pid, 0.0)
                out.append(GpuProcess(index, pid, int((process.usedGpuMemory or 0) // MIB), sm))
        return out

    def _listed(self, handle: Any, call: str) -> list[Any] | None:
        """One of NVML's process lists for a GPU; None where it cannot be read (a driver
        without the call, or a GPU that refuses it: no MPS list where MPS never ran)."""
        nvml = self.nvml
        read = getattr(nvml, call, None)
        if read is None:
            return None
        try:
            return list(read(handle))
        except nvml.NVMLError:
            return None

    def _sm_by_pid(self, index: int, handle: Any) -> dict[int, float] | None:
        """Each process's mean SM share over the samples since the last read; None where the
        GPU gives no per-process samples (then only the SDK's word is left)."""
        nvml = self.nvml
        read = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
        if read is None or index in self._no_samples:
            return None
        try:
            samples = read(handle, self._seen.get(index, 0))
        except nvml.NVMLError as err:
            if isinstance(err, getattr(nvml, "NVMLError_NotFound", ())):
                return {}  # no process ran a kernel since the last read
            if isinstance(err, getattr(nvml, "NVMLError_NotSupported", ())):
                self._no_samples.add(index)
            return None
        shares: dict[int, list[float]] = {}
        for sample in samples:
            shares.setdefault(int(sample.pid), []).append(min(1.0, sample.smUtil / 100.0))
            self._seen[index] = max(self._seen.get(index, 0), int(sample.timeStamp))
        return {pid: sum(values) / len(values) for pid, values in shares.items()}

    # ----- health ------------------------------------------------------------------------

    def _register_events(self) -> Any:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return None
        for handle in self.handles:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError:
                continue  # not supported on this GPU: the lost-GPU probe still covers it
        return events

    def _lost(self) -> list[HealthEvent]:
        nvml = self.nvml
        lost = []
        for index, handle in enumerate(self.handles):
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as err:
                if isinstance(err, getattr(nvml, "NVMLError_GpuIsLost", ())):
                    lost.append(HealthEvent(index, "GPU is lost"))
        return lost

    def health_events(self, wait_seconds: float) -> list[HealthEvent]:
        nvml = self.nvml
        events = self._lost()
        if self._events is None or events:
            return events
        try:
            data = nvml.nvmlEventSetWait_v2(self._events, int(wait_seconds * 1000))
        except nvml.NVMLError:
            return events  # the timeout is an NVMLError too
        xid = int(data.eventData)
        if not is_critical_xid(xid):
            return events
        index = next((i for i, h in enumerate(self.handles) if h == data.device), None)
        if index is None:
            # NVML could not say which GPU: treat every GPU as suspect, as NVIDIA's plugin does.
            return [HealthEvent(i, f"XID {xid}") for i in range(len(self.handles))]
        return [HealthEvent(index, f"XID {xid}")]

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self._events)
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()
