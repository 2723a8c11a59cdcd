"""What a training job asks of the cluster: a gang of identical workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gangshare.core.constraints import UNCONSTRAINED, PodConstraints

DEFAULT_OPPORTUNISTIC_MEMORY_MIB = 2048


class ServiceClass(StrEnum):
    # Counted against quota, one per GPU, must run at solo speed.
    GUARANTEED = "Guaranteed"
    # Lives on spare memory and SM time; squeezed first, never counted against quota.
    OPPORTUNISTIC = "Opportunistic"


class TopologyPolicy(StrEnum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"
    NONE = "None"


class TopologyScope(StrEnum):
    # Each worker's GPUs inside one NVLink island.
    NVLINK = "NVLink"
    # The whole gang on one node.
    NODE = "Node"
    # The whole gang inside one rack (switch).
    RACK = "Rack"


@dataclass(frozen=True)
class Topology:
    policy: TopologyPolicy = TopologyPolicy.PREFERRED
    scope: TopologyScope = TopologyScope.NVLINK
    relax_after_seconds: float | None = None

    def relaxed(self) -> Topology:
        """A Required preference that waited too long becomes Preferred."""
        if self.policy is TopologyPolicy.REQUIRED:
            return Topology(TopologyPolicy.PREFERRED, self.scope, None)
        return self

    def effective(self, waited_seconds: float) -> Topology:
        """The topology to plan with after waiting this long (Philly's locality relaxation).

        With `relax_after_seconds`, a Required scope turns Preferred once that long has
        passed, and a Preferred one holds out for its scope until then (as Required):
        waiting a little for locality beats running slowly spread out.
        """
        if self.relax_after_seconds is None:
            return self
        if waited_seconds >= self.relax_after_seconds:
            return self.relaxed()
        if self.policy is TopologyPolicy.PREFERRED:
            return Topology(TopologyPolicy.REQUIRED, self.scope, self.relax_after_seconds)
        return self

    @property
    def island_policy(self) -> TopologyPolicy:
        """How strictly each worker's GPUs must sit in one NVLink island."""
        if self.policy is TopologyPolicy.NONE:
            return TopologyPolicy.NONE
        if self.scope is TopologyScope.NVLINK:
            return self.policy
        # A node- or rack-scoped gang still gains from island-local workers.
        return TopologyPolicy.PREFERRED


@dataclass(frozen=True)
class WorkerRequest:
    """What one worker (one pod) needs on one node."""

    gpus: int
    service_class: ServiceClass = ServiceClass.GUARANTEED
    # Per-GPU memory an opportunistic worker needs; guaranteed workers own whole GPUs.
    gpu_memory_mib: int | None = None
    gpu_model: str | None = None
    island_policy: TopologyPolicy = TopologyPolicy.PREFERRED
    # Taints, selectors, affinity and non-GPU resources kube-scheduler will check.
    constraints: PodConstraints = UNCONSTRAINED

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus: must be at least 1, got {self.gpus}")
        if self.gpu_memory_mib is not None and self.gpu_memory_mib < 1:
            raise ValueError(f"gpuMemory: must be positive, got {self.gpu_memory_mib} MiB")

    @property
    def guaranteed(self) -> bool:
        return self.service_class is ServiceClass.GUARANTEED

    @property
    def opportunistic_memory_mib(self) -> int:
        return self.gpu_memory_mib or DEFAULT_OPPORTUNISTIC_MEMORY_MIB


@dataclass(frozen=True)
class GangRequest:
    """An all-or-nothing ask: `workers` identical workers, placed together or not at all."""

    owner: str
    workers: int
    gpus_per_worker: int
    service_class: ServiceClass = ServiceClass.GUARANTEED
    topology: Topology = field(default_factory=Topology)
    gpu_memory_mib: int | None = None
    gpu_model: str | None = None
    constraints: PodConstraints = UNCONSTRAINED
    # Its workers' GPU resource is fixed by someone else's template (a batch/v1 Job's, which
    # the API server keeps immutable): it asks whole GPUs even when it borrows, so it borrows
    # idle GPUs, never share slots beside a Guaranteed job.
    whole_gpus: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers: must be at least 1, got {self.workers}")
        if self.gpus_per_worker < 1:
            raise ValueError(f"gpusPerWorker: must be at least 1, got {self.gpus_per_worker}")

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    def worker(self, island_policy: TopologyPolicy | None = None) -> WorkerRequest:
        return WorkerRequest(
            gpus=self.gpus_per_worker,
            service_class=self.service_class,
            gpu_memory_mib=self.gpu_memory_mib,
            gpu_model=self.gpu_model,
            island_policy=self.topology.island_policy if island_policy is None else island_policy,
            constraints=self.constraints,
        )
