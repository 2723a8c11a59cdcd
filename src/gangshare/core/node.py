"""A GPU node as the scheduler sees it: GPUs, NVLink islands, rack, and who holds what."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gangshare.core.constraints import Taint
from gangshare.core.gpu import Gpu, GpuState
from gangshare.core.topology import Island, normalize_islands

# One counter for every node, so a node rebuilt under the same name never reuses a version.
_VERSIONS = itertools.count(1)


@dataclass
class NodeState:
    name: str
    gpus: list[GpuState]
    islands: tuple[Island, ...]
    rack: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    # Why the node takes no new work (cordoned, NotReady); None when it does. Taints are
    # per pod (tolerations), so they are kept apart.
    unschedulable_reason: str | None = None
    taints: tuple[Taint, ...] = ()
    # What kube-scheduler's resource fit sees (CPU millicores, memory bytes, pods, extended
    # resources); None when unknown (the simulator, the extender), which skips the check.
    allocatable: Mapping[str, int] | None = None
    requested: dict[str, int] = field(default_factory=dict)
    _free_guaranteed: int = field(default=-1, repr=False)
    # Bumped on every change, so callers can memoize per-node answers (like a generation).
    version: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        indices = [g.index for g in self.gpus]
        if indices != list(range(len(indices))):
            raise ValueError(f"node {self.name}: GPU indices must be 0..{len(indices) - 1}")
        self.recount()

    @classmethod
    def build(
        cls,
        name: str,
        gpus: Iterable[Gpu],
        islands: Iterable[Iterable[int]] = (),
        rack: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> NodeState:
        states = [GpuState(g) for g in sorted(gpus, key=lambda g: g.index)]
        return cls(
            name=name,
            gpus=states,
            islands=normalize_islands((s.index for s in states), islands),
            rack=rack,
            labels=dict(labels or {}),
        )

    def recount(self) -> None:
        """Refresh cached counts and the version; call after every change to the node."""
        self._free_guaranteed = sum(1 for g in self.gpus if g.free_for_guaranteed)
        self.version = next(_VERSIONS)

    def shareable_spares(self) -> tuple[int, ...]:
        """The spare memory (MiB) of each GPU an opportunistic worker could share now
        (healthy, a share slot free), largest first."""
        return tuple(
            sorted(
                (g.spare_memory_mib() for g in self.gpus if g.gpu.healthy and g.free_share_slots()),
                reverse=True,
            )
        )

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def free_guaranteed(self) -> int:
        return self._free_guaranteed

    @property
    def schedulable(self) -> bool:
        return self.unschedulable_reason is None

    @property
    def gpu_model(self) -> str:
        return self.gpus[0].gpu.model if self.gpus else ""

    def island_of(self, gpu_index: int) -> Island:
        for island in self.islands:
            if gpu_index in island:
                return island
        raise KeyError(gpu_index)
