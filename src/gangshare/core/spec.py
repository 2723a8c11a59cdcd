"""Cluster spec files: node pools of GPU nodes, as the dev cluster and the simulator build them.

    nodePools:
      - name: dgx            # nodes dgx-0, dgx-1, ...
        count: 4
        racks: [rack-a, rack-b]   # round-robin; or `rack: rack-a`
        gpusPerNode: 8
        gpuModel: NVIDIA-H100-80GB-HBM3
        gpuMemoryMiB: 81559
        nvlinkIslands: [[0, 1, 2, 3], [4, 5, 6, 7]]   # or linkMatrix: [[0, 1, ...], ...]
        shareSlots: 4
        cpu: "96"
        memory: 1Ti

Every error names the field it is about, e.g. `nodePools[1].gpusPerNode: ...`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gangshare.core.gpu import DEFAULT_SHARE_SLOTS, Gpu, GpuState
from gangshare.core.node import NodeState
from gangshare.core.topology import Island, islands_from_link_matrix, normalize_islands

MAX_GPUS_PER_NODE = 64
MAX_NODES_PER_POOL = 100_000


class SpecError(ValueError):
    """A cluster spec that cannot be used; the message starts with the field path."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    rack: str
    gpus: tuple[Gpu, ...]
    islands: tuple[Island, ...]
    share_slots: int = DEFAULT_SHARE_SLOTS
    cpu: str = "64"
    memory: str = "512Gi"
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_state(self) -> NodeState:
        states = [GpuState(g, share_slots=self.share_slots) for g in self.gpus]
        return NodeState(self.name, states, self.islands, self.rack, dict(self.labels))


def gpu_uuid(node: str, index: int) -> str:
    """A stable, UUID-shaped id for a simulated GPU (real ones come from NVML)."""
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _field(pool: Mapping[str, Any], path: str, key: str, kind: type, default: Any = None) -> Any:
    value = pool.get(key, default)
    if value is None:
        raise SpecError(f"{path}.{key}: required")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SpecError(f"{path}.{key}: must be an integer, got {value!r}")
    if kind is str and not isinstance(value, str | int):
        raise SpecError(f"{path}.{key}: must be a string, got {value!r}")
    return str(value) if kind is str else value


def _bounded(value: int, path: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise SpecError(f"{path}: must be between {low} and {high}, got {value}")
    return value


def _islands(pool: Mapping[str, Any], path: str, gpus: int) -> tuple[Island, ...]:
    if "nvlinkIslands" in pool and "linkMatrix" in pool:
        raise SpecError(f"{path}: give nvlinkIslands or linkMatrix, not both")
    try:
        if "linkMatrix" in pool:
            matrix = pool["linkMatrix"]
            if not isinstance(matrix, Sequence) or len(matrix) != gpus:
                raise SpecError(f"{path}.linkMatrix: must be a {gpus}x{gpus} matrix")
            return islands_from_link_matrix(matrix)
        declared = pool.get("nvlinkIslands", [])
        if not isinstance(declared, Sequence) or any(not isinstance(i, Sequence) for i in declared):
            raise SpecError(f"{path}.nvlinkIslands: must be a list of lists of GPU indices")
        return normalize_islands(range(gpus), declared)
    except SpecError:
        raise
    except ValueError as err:
        raise SpecError(f"{path}.{err}") from None


def _racks(pool: Mapping[str, Any], path: str) -> list[str]:
    if "racks" in pool:
        racks = pool["racks"]
        if not isinstance(racks, list) or not racks or not all(isinstance(r, str) for r in racks):
            raise SpecError(f"{path}.racks: must be a non-empty list of rack names")
        return list(racks)
    return [_field(pool, path, "rack", str, "rack-0")]


def parse_cluster_spec(doc: Mapping[str, Any]) -> list[NodeSpec]:
    pools = doc.get("nodePools") if isinstance(doc, Mapping) else None
    if not isinstance(pools, list) or not pools:
        raise SpecError("nodePools: must be a non-empty list")
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for position, pool in enumerate(pools):
        path = f"nodePools[{position}]"
        if not isinstance(pool, Mapping):
            raise SpecError(f"{path}: must be a mapping")
        name = _field(pool, path, "name", str)
        count = _bounded(
            _field(pool, path, "count", int, 1), f"{path}.count", 1, MAX_NODES_PER_POOL
        )
        gpus = _bounded(
            _field(pool, path, "gpusPerNode", int), f"{path}.gpusPerNode", 1, MAX_GPUS_PER_NODE
        )
        memory = _bounded(
            _field(pool, path, "gpuMemoryMiB", int, 81920), f"{path}.gpuMemoryMiB", 1, 10**7
        )
        slots = _bounded(
            _field(pool, path, "shareSlots", int, DEFAULT_SHARE_SLOTS), f"{path}.shareSlots", 1, 64
        )
        model = _field(pool, path, "gpuModel", str, "NVIDIA-H100-80GB-HBM3")
        islands = _islands(pool, path, gpus)
        racks = _racks(pool, path)
        for i in range(count):
            node = f"{name}-{i}"
            if node in seen:
                raise SpecError(f"{path}.name: node name {node} is used twice")
            seen.add(node)
            nodes.append(
                NodeSpec(
                    name=node,
                    rack=racks[i % len(racks)],
                    gpus=tuple(Gpu(g, gpu_uuid(node, g), model, memory) for g in range(gpus)),
                    islands=islands,
                    share_slots=slots,
                    cpu=_field(pool, path, "cpu", str, "64"),
                    memory=_field(pool, path, "memory", str, "512Gi"),
                    labels={"gangshare.io/pool": name},
                )
            )
    return nodes
