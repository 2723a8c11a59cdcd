"""A fake GPU backend from a cluster spec file, for machines without a GPU.

The node's GPUs, model, memory and NVLink islands come from the same `nodePools` format the dev
cluster uses (`gangshare.core.spec`); a pool may add a `fake:` section with what changes over
time, in seconds since the backend started:

    nodePools:
      - name: real
        gpusPerNode: 4
        nvlinkIslands: [[0, 1], [2, 3]]
        fake:
          utilization:                       # the last entry whose `at` has passed holds
            - at: 0
              gpus: {"0": {sm: 0.4, memoryUsedMiB: 2048}}
          processes:                         # sm: the process's SM share, as NVML
            - {gpu: 0, pid: 4242, memoryMiB: 1024, sm: 0.9, at: 0, until: 600}
            - {gpu: 0, pid: 4343, memoryMiB: 512, mps: true}   # an MPS client: NVML's MPS
                                                               # list names it, not the other
          failures:
            - {gpu: 1, at: 5, xid: 79}        # or `lost: true`

The file is read again whenever it changes, so a test can inject a failure into a running
agent by rewriting it. Every error names the field it is about.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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
from gangshare.core.spec import NodeSpec, SpecError, parse_cluster_spec

log = logging.getLogger("gangshare.agent")


@dataclass(frozen=True)
class Failure:
    gpu: int
    at: float
    reason: str


@dataclass(frozen=True)
class FakeNode:
    inventory: Inventory
    utilization: tuple[tuple[float, dict[int, tuple[float, int]]], ...]
    # (at, until, process, whether NVML lists it as an MPS client rather than a compute one)
    processes: tuple[tuple[float, float, GpuProcess, bool], ...]
    failures: tuple[Failure, ...]


def _number(value: Any, path: str, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise BackendError(f"{path}: must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _integer(value: Any, path: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BackendError(f"{path}: must be an integer >= {minimum}, got {value!r}")
    return value


def _gpu(value: Any, path: str, count: int) -> int:
    index = _integer(int(value) if isinstance(value, str) and value.isdigit() else value, path)
    if index >= count:
        raise BackendError(f"{path}: no GPU {index} on a node with {count} GPUs")
    return index


def _list(section: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = section.get(key, [])
    if not isinstance(value, list):
        raise BackendError(f"{path}.{key}: must be a list")
    return value


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BackendError(f"{path}: must be a mapping")
    return value


def parse_fake(section: Any, path: str, count: int) -> tuple[Any, Any, Any]:
    fake = _mapping(section if section is not None else {}, path)
    unknown = sorted(set(fake) - {"utilization", "processes", "failures"})
    if unknown:
        raise BackendError(f"{path}.{unknown[0]}: unknown field")
    timeline = []
    for i, entry in enumerate(_list(fake, "utilization", path)):
        where = f"{path}.utilization[{i}]"
        entry = _mapping(entry, where)
        per_gpu: dict[int, tuple[float, int]] = {}
        for key, value in _mapping(entry.get("gpus", {}), f"{where}.gpus").items():
            field_path = f"{where}.gpus.{key}"
            value = _mapping(value, field_path)
            sm = _number(value.get("sm", 0.0), f"{field_path}.sm")
            if sm > 1:
                raise BackendError(f"{field_path}.sm: must be between 0 and 1, got {sm:g}")
            memory = _integer(value.get("memoryUsedMiB", 0), f"{field_path}.memoryUsedMiB")
            per_gpu[_gpu(key, field_path, count)] = (sm, memory)
        timeline.append((_number(entry.get("at", 0), f"{where}.at"), per_gpu))
    processes = []
    for i, entry in enumerate(_list(fake, "processes", path)):
        where = f"{path}.processes[{i}]"
        entry = _mapping(entry, where)
        process_sm = None
        if entry.get("sm") is not None:
            process_sm = _number(entry["sm"], f"{where}.sm")
            if process_sm > 1:
                raise BackendError(f"{where}.sm: must be between 0 and 1, got {process_sm:g}")
        process = GpuProcess(
            _gpu(entry.get("gpu"), f"{where}.gpu", count),
            _integer(entry.get("pid"), f"{where}.pid", 1),
            _integer(entry.get("memoryMiB", 0), f"{where}.memoryMiB"),
            process_sm,
        )
        start = _number(entry.get("at", 0), f"{where}.at")
        until = _number(entry.get("until", float("inf")), f"{where}.until")
        mps = entry.get("mps", False)
        if not isinstance(mps, bool):
            raise BackendError(f"{where}.mps: must be true or false, got {mps!r}")
        processes.append((start, until, process, mps))
    failures = []
    for i, entry in enumerate(_list(fake, "failures", path)):
        where = f"{path}.failures[{i}]"
        entry = _mapping(entry, where)
        gpu = _gpu(entry.get("gpu"), f"{where}.gpu", count)
        at = _number(entry.get("at", 0), f"{where}.at")
        if entry.get("lost"):
            reason = "GPU is lost"
        else:
            xid = _integer(entry.get("xid"), f"{where}.xid", 1)
            if not is_critical_xid(xid):
                raise BackendError(
                    f"{where}.xid: XID {xid} is an application error and never marks a GPU "
                    "unhealthy; use a critical one such as 48, 79 or 94"
                )
            reason = f"XID {xid}"
        failures.append(Failure(gpu, at, reason))
    return sorted(timeline, key=lambda t: t[0]), processes, failures


def _pool_of(doc: Mapping[str, Any], node: NodeSpec) -> tuple[int, Mapping[str, Any]]:
    pool_name = node.labels.get("gangshare.io/pool")
    for position, pool in enumerate(doc["nodePools"]):
        if pool.get("name") == pool_name:
            return position, pool
    raise BackendError(f"nodePools: no pool for node {node.name}")  # parse_cluster_spec made it


def load_fake_node(text: str, node_name: str, source: str = "fake spec") -> FakeNode:
    """The fake node named `node_name` (or the spec's only node) from a cluster spec's text."""
    try:
        doc = yaml.safe_load(text)
        nodes = parse_cluster_spec(doc)
    except yaml.YAMLError as err:
        raise BackendError(f"{source}: not valid YAML ({err})") from None
    except SpecError as err:
        raise BackendError(f"{source}: {err}") from None
    matching = [n for n in nodes if n.name == node_name] or (nodes if len(nodes) == 1 else [])
    if not matching:
        names = ", ".join(n.name for n in nodes[:8])
        raise BackendError(f"{source}: no node named {node_name} (the spec has {names})")
    node = matching[0]
    position, pool = _pool_of(doc, node)
    try:
        timeline, processes, failures = parse_fake(
            pool.get("fake"), f"nodePools[{position}].fake", len(node.gpus)
        )
    except BackendError as err:
        raise BackendError(f"{source}: {err}") from None
    members = {g: island for island in node.islands for g in island}
    links = tuple(
        tuple(1 if a != b and b in members[a] else 0 for b in range(len(node.gpus)))
        for a in range(len(node.gpus))
    )
    gpus = tuple(GpuInfo(g.index, g.uuid, g.model, g.memory_mib) for g in node.gpus)
    return FakeNode(Inventory(gpus, links), tuple(timeline), tuple(processes), tuple(failures))


class FakeBackend:
    """The GpuBackend the tests and `--nvml fake` use; re-reads its spec file on change."""

    def __init__(
        self,
        path: Path,
        node_name: str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = path
        self.node_name = node_name
        self.clock = clock
        self.sleep = sleep
        self.started = clock()
        self._mtime = 0
        self._reported: set[tuple[int, str]] = set()
        self.node = self._read()

    def _read(self) -> FakeNode:
        try:
            text = self.path.read_text()
            self._mtime = os.stat(self.path).st_mtime_ns
        except OSError as err:
            raise BackendError(f"fake spec {self.path}: cannot read ({err.strerror})") from None
        return load_fake_node(text, self.node_name, f"fake spec {self.path}")

    def _refresh(self) -> None:
        try:
            changed = os.stat(self.path).st_mtime_ns != self._mtime
        except OSError:
            return
        if not changed:
            return
        try:
            node = self._read()
        except BackendError as err:
            # A half-written or broken file must not take a running node down: keep the last.
            log.error("%s; keeping the previous fake GPUs", err)
            return
        if node.inventory != self.node.inventory:
            log.warning("fake spec %s changed the GPU inventory; keeping the old one", self.path)
            node = FakeNode(self.node.inventory, node.utilization, node.processes, node.failures)
        self.node = node

    def _elapsed(self) -> float:
        return self.clock() - self.started

    def inventory(self) -> Inventory:
        return self.node.inventory

    def samples(self) -> list[GpuSample]:
        self._refresh()
        now = self._elapsed()
        current: dict[int, tuple[float, int]] = {}
        for at, per_gpu in self.node.utilization:
            if at <= now:
                current = per_gpu
        return [
            GpuSample(g.index, *current.get(g.index, (0.0, 0))) for g in self.node.inventory.gpus
        ]

    def processes(self) -> list[GpuProcess]:
        self._refresh()
        now = self._elapsed()
        live = [(p, mps) for at, until, p, mps in self.node.processes if at <= now < until]
        out: list[GpuProcess] = []
        for gpu in self.node.inventory.gpus:
            on_gpu = [(p, mps) for p, mps in live if p.index == gpu.index]
            compute = [p for p, mps in on_gpu if not mps]
            out += merged_processes(compute, [p for p, mps in on_gpu if mps])
        return out

    def _due(self) -> list[HealthEvent]:
        now = self._elapsed()
        events = []
        for failure in self.node.failures:
            key = (failure.gpu, failure.reason)
            if failure.at <= now and key not in self._reported:
                self._reported.add(key)
                events.append(HealthEvent(failure.gpu, failure.reason))
        return events

    def health_events(self, wait_seconds: float) -> list[HealthEvent]:
        deadline = self.clock() + wait_seconds
        while True:
            self._refresh()
            events = self._due()
            if events or self.clock() >= deadline:
                return events
            self.sleep(min(0.2, max(0.0, deadline - self.clock())))

    def close(self) -> None:
        return None
