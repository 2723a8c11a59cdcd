"""Builders for agent tests: fake GPU specs as the dev cluster writes them, devices, pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gangshare.agent.devices import DeviceMap
from gangshare.agent.fake_nvml import FakeBackend, load_fake_node


class FakeSpec:
    """make_spec().gpus(8).islands([0, 1, 2, 3], [4, 5, 6, 7]).failure(gpu=1, at=5, xid=79)"""

    def __init__(self, name: str = "real") -> None:
        self.pool: dict[str, Any] = {"name": name, "count": 1, "gpusPerNode": 4}
        self.fake: dict[str, Any] = {}

    def gpus(self, count: int, memory_mib: int = 81920) -> FakeSpec:
        self.pool.update(gpusPerNode=count, gpuMemoryMiB=memory_mib)
        return self

    def islands(self, *islands: list[int]) -> FakeSpec:
        self.pool["nvlinkIslands"] = [list(i) for i in islands]
        return self

    def utilization(self, at: float, **per_gpu: tuple[float, int]) -> FakeSpec:
        gpus = {
            k.removeprefix("gpu"): {"sm": v[0], "memoryUsedMiB": v[1]} for k, v in per_gpu.items()
        }
        self.fake.setdefault("utilization", []).append({"at": at, "gpus": gpus})
        return self

    def process(
        self,
        gpu: int,
        pid: int,
        memory_mib: int,
        at: float = 0,
        until: float = 1e9,
        sm: float | None = None,
        mps: bool = False,
    ) -> FakeSpec:
        entry: dict[str, Any] = {
            "gpu": gpu,
            "pid": pid,
            "memoryMiB": memory_mib,
            "at": at,
            "until": until,
        }
        if sm is not None:
            entry["sm"] = sm
        if mps:
            entry["mps"] = True
        self.fake.setdefault("processes", []).append(entry)
        return self

    def failure(
        self, gpu: int, at: float = 0, xid: int | None = 79, lost: bool = False
    ) -> FakeSpec:
        entry: dict[str, Any] = {"gpu": gpu, "at": at}
        entry.update({"lost": True} if lost else {"xid": xid})
        self.fake.setdefault("failures", []).append(entry)
        return self

    def doc(self) -> dict[str, Any]:
        pool = dict(self.pool)
        if self.fake:
            pool["fake"] = self.fake
        return {"nodePools": [pool]}

    def text(self) -> str:
        return yaml.safe_dump(self.doc())

    def write(self, path: Path) -> Path:
        path.write_text(self.text())
        return path

    def devices(self, share_slots: int = 4) -> DeviceMap:
        return DeviceMap(load_fake_node(self.text(), "real-0").inventory, share_slots)


def make_spec(name: str = "real") -> FakeSpec:
    return FakeSpec(name)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def fake_backend(spec: FakeSpec, path: Path) -> tuple[FakeBackend, FakeClock]:
    clock = FakeClock()
    return FakeBackend(spec.write(path), "real-0", clock=clock, sleep=clock.sleep), clock


def pod(
    name: str,
    resource: str,
    count: int,
    planned: str | None = None,
    assigned: str | None = None,
    phase: str = "Pending",
    namespace: str = "ns",
) -> dict[str, Any]:
    annotations = {}
    if planned is not None:
        annotations["gangshare.io/planned-gpus"] = planned
    if assigned is not None:
        annotations["gangshare.io/assigned-gpus"] = assigned
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "real-0",
            "containers": [{"name": "c", "resources": {"limits": {resource: str(count)}}}],
        },
        "status": {"phase": phase},
    }
