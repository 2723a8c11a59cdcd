"""Fluent builders for core objects: make_node("a").gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7])."""

from __future__ import annotations

from gangshare.core import (
    Cluster,
    GangRequest,
    Gpu,
    NodeState,
    PodSet,
    ServiceClass,
    Topology,
    TopologyPolicy,
    TopologyScope,
)
from gangshare.core.constraints import UNCONSTRAINED, PodConstraints, Taint
from gangshare.core.gpu import GpuState


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._gpus = 8
        self._model = "NVIDIA-H100-80GB-HBM3"
        self._memory = 81920
        self._islands: list[list[int]] = []
        self._rack = "rack-0"
        self._utilization: dict[int, float] = {}
        self._memory_used: dict[int, int] = {}
        self._unhealthy: set[int] = set()
        self._cordon: str | None = None
        self._slots = 4
        self._taints: list[Taint] = []
        self._labels: dict[str, str] = {}
        self._allocatable: dict[str, int] | None = None
        self._requested: dict[str, int] = {}

    def gpus(
        self, count: int, model: str | None = None, memory_mib: int | None = None
    ) -> NodeBuilder:
        self._gpus = count
        self._model = model or self._model
        self._memory = memory_mib or self._memory
        return self

    def nvlink(self, *islands: list[int]) -> NodeBuilder:
        self._islands = [list(i) for i in islands]
        return self

    def rack(self, rack: str) -> NodeBuilder:
        self._rack = rack
        return self

    def utilization(self, **by_gpu: float) -> NodeBuilder:
        self._utilization.update({int(k.removeprefix("gpu")): v for k, v in by_gpu.items()})
        return self

    def memory_used(self, gpu: int, mib: int) -> NodeBuilder:
        self._memory_used[gpu] = mib
        return self

    def unhealthy(self, *gpus: int) -> NodeBuilder:
        self._unhealthy.update(gpus)
        return self

    def cordoned(self, reason: str = "node is cordoned") -> NodeBuilder:
        self._cordon = reason
        return self

    def share_slots(self, slots: int) -> NodeBuilder:
        self._slots = slots
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> NodeBuilder:
        self._taints.append(Taint(key, value, effect))
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._labels[key] = value
        return self

    def allocatable(self, cpu_milli: int, memory_gib: int, pods: int = 110) -> NodeBuilder:
        self._allocatable = {"cpu": cpu_milli, "memory": memory_gib * 2**30, "pods": pods}
        return self

    def requested(self, **amounts: int) -> NodeBuilder:
        self._requested.update(amounts)
        return self

    def build(self) -> NodeState:
        node = NodeState.build(
            self._name,
            [
                Gpu(i, f"GPU-{self._name}-{i}", self._model, self._memory, i not in self._unhealthy)
                for i in range(self._gpus)
            ],
            self._islands,
            rack=self._rack,
            labels=self._labels,
        )
        for gpu in node.gpus:
            gpu.share_slots = self._slots
        for index, value in self._utilization.items():
            node.gpus[index].utilization = value
        for index, mib in self._memory_used.items():
            node.gpus[index].memory_used_mib = mib
        node.unschedulable_reason = self._cordon
        node.taints = tuple(self._taints)
        node.allocatable = self._allocatable
        node.requested = dict(self._requested)
        node.recount()
        return node


def make_node(name: str = "node-0") -> NodeBuilder:
    return NodeBuilder(name)


class ClusterBuilder:
    def __init__(self) -> None:
        self._nodes: list[NodeBuilder] = []
        self._holds: list[tuple[str, str, tuple[int, ...], ServiceClass, int | None]] = []

    def node(self, builder: NodeBuilder) -> ClusterBuilder:
        self._nodes.append(builder)
        return self

    def nodes(self, count: int, prefix: str = "node", **shape: object) -> ClusterBuilder:
        for i in range(count):
            builder = make_node(f"{prefix}-{i}")
            if "gpus" in shape:
                builder.gpus(int(str(shape["gpus"])))
            if "islands" in shape:
                builder.nvlink(*shape["islands"])  # type: ignore[misc]
            if "racks" in shape:
                racks = list(shape["racks"])  # type: ignore[call-overload]
                builder.rack(racks[i % len(racks)])
            self._nodes.append(builder)
        return self

    def holding(
        self,
        owner: str,
        node: str,
        gpus: tuple[int, ...],
        service_class: ServiceClass = ServiceClass.GUARANTEED,
        memory_mib: int | None = None,
    ) -> ClusterBuilder:
        self._holds.append((owner, node, gpus, service_class, memory_mib))
        return self

    def build(self) -> Cluster:
        cluster = Cluster(b.build() for b in self._nodes)
        for owner, node, gpus, service_class, memory in self._holds:
            cluster.allocate(owner, f"{owner}/0", node, gpus, service_class, memory)
        return cluster


def make_cluster() -> ClusterBuilder:
    return ClusterBuilder()


class GangBuilder:
    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._workers = 1
        self._gpus = 1
        self._class = ServiceClass.GUARANTEED
        self._memory: int | None = None
        self._topology = Topology()
        self._model: str | None = None
        self._constraints = UNCONSTRAINED
        self._companions: list[PodSet] = []

    def workers(self, count: int) -> GangBuilder:
        self._workers = count
        return self

    def gpus(self, count: int) -> GangBuilder:
        self._gpus = count
        return self

    def opportunistic(self, memory_mib: int | None = None) -> GangBuilder:
        self._class = ServiceClass.OPPORTUNISTIC
        self._memory = memory_mib
        return self

    def topology(
        self, policy: TopologyPolicy, scope: TopologyScope, relax_after: float | None = None
    ) -> GangBuilder:
        self._topology = Topology(policy, scope, relax_after)
        return self

    def model(self, model: str) -> GangBuilder:
        self._model = model
        return self

    def constrained(self, constraints: PodConstraints) -> GangBuilder:
        self._constraints = constraints
        return self

    def with_pod_set(
        self,
        name: str,
        count: int = 1,
        gpus: int = 0,
        constraints: PodConstraints = UNCONSTRAINED,
    ) -> GangBuilder:
        """Another pod set beside the workers (a CPU-only launcher when gpus=0)."""
        self._companions.append(PodSet(name, count, gpus, constraints))
        return self

    def build(self) -> GangRequest:
        return GangRequest(
            self._owner,
            self._workers,
            self._gpus,
            self._class,
            self._topology,
            self._memory,
            self._model,
            self._constraints,
            companions=tuple(self._companions),
        )


def make_gang(owner: str = "ns/job") -> GangBuilder:
    return GangBuilder(owner)


__all__ = ["GpuState", "make_cluster", "make_gang", "make_node"]
