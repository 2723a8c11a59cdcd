"""Per-node filter: can one worker run here, and if not, why not (in words a user reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gangshare.core.constraints import (
    PodConstraints,
    resource_room,
    selector_mismatch,
    short_resource,
    untolerated_taint,
)
from gangshare.core.gpu import GpuState
from gangshare.core.job import TopologyPolicy, WorkerRequest
from gangshare.core.node import NodeState


@dataclass(frozen=True)
class Rejection:
    node: str
    reason: str
    # False when freeing GPUs (preemption, waiting) cannot make the node fit.
    resolvable: bool = True


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def fits_opportunistic(gpu: GpuState, memory_mib: int) -> bool:
    return gpu.gpu.healthy and gpu.free_share_slots() > 0 and gpu.spare_memory_mib() >= memory_mib


def node_rejection(node: NodeState, constraints: PodConstraints) -> Rejection | None:
    """Why no pod with these constraints may run on the node, GPUs aside (what kube-scheduler
    checks of a CPU-only pod: schedulable, taints, nodeSelector and node affinity)."""
    if not node.schedulable:
        return Rejection(node.name, node.unschedulable_reason or "node is unschedulable", False)
    if node.taints:
        taint = untolerated_taint(node.taints, constraints.tolerations)
        if taint is not None:
            return Rejection(
                node.name, f"node has taint {taint} the worker does not tolerate", False
            )
    if constraints.node_selector or constraints.affinity:
        mismatch = selector_mismatch(node.name, node.labels, constraints)
        if mismatch is not None:
            return Rejection(node.name, mismatch, False)
    return None


def pods_room(node: NodeState, constraints: PodConstraints, empty: bool = False) -> int | None:
    """How many more CPU-only pods with these requests fit on the node (None: no bound known);
    `empty`: with nothing else on it."""
    if node.allocatable is None:
        return None
    return resource_room(
        node.allocatable, {} if empty else node.requested, constraints.resource_map()
    )


def static_rejection(node: NodeState, req: WorkerRequest) -> Rejection | None:
    """Reasons no amount of waiting fixes: the node itself does not match."""
    rejection = node_rejection(node, req.constraints)
    if rejection is not None:
        return rejection
    if req.gpu_model is not None and node.gpu_model != req.gpu_model:
        return Rejection(
            node.name, f"GPU model {node.gpu_model or 'none'}, job requires {req.gpu_model}", False
        )
    if node.gpu_count < req.gpus:
        return Rejection(
            node.name,
            f"node has {_plural(node.gpu_count, 'GPU')}, worker needs {req.gpus}",
            False,
        )
    if req.island_policy is TopologyPolicy.REQUIRED:
        largest = max((len(i) for i in node.islands), default=0)
        if largest < req.gpus:
            return Rejection(
                node.name,
                f"largest NVLink island has {_plural(largest, 'GPU')}, "
                f"worker needs {req.gpus} in one island",
                False,
            )
    return None


def usable_gpus(
    node: NodeState, req: WorkerRequest, exclude: frozenset[int] = frozenset()
) -> list[int]:
    """GPUs one worker of `req` could take on this node right now."""
    if req.guaranteed:
        return [g.index for g in node.gpus if g.index not in exclude and g.free_for_guaranteed]
    memory = req.opportunistic_memory_mib
    return [g.index for g in node.gpus if g.index not in exclude and fits_opportunistic(g, memory)]


def worker_capacity(
    node: NodeState, req: WorkerRequest, exclude: frozenset[int] = frozenset()
) -> int:
    """How many workers of `req` fit on the node at once (distinct GPUs per worker)."""
    if static_rejection(node, req) is not None:
        return 0
    return _room(node, req, exclude)


def _room(node: NodeState, req: WorkerRequest, exclude: frozenset[int] = frozenset()) -> int:
    """worker_capacity for a node that already passed the static checks."""
    return _bounded_by_resources(node, req, _gpu_room(node, req, exclude), node.requested)


def _gpu_room(node: NodeState, req: WorkerRequest, exclude: frozenset[int]) -> int:
    if req.guaranteed and not exclude and req.island_policy is not TopologyPolicy.REQUIRED:
        return node.free_guaranteed // req.gpus
    return _workers_on(node, req, usable_gpus(node, req, exclude))


def _workers_on(node: NodeState, req: WorkerRequest, usable: Sequence[int]) -> int:
    """Workers of `req` that fit on these GPUs, inside one island each when Required."""
    if req.island_policy is not TopologyPolicy.REQUIRED:
        return len(usable) // req.gpus
    usable_set = set(usable)
    return sum(sum(1 for i in island if i in usable_set) // req.gpus for island in node.islands)


def _bounded_by_resources(
    node: NodeState, req: WorkerRequest, workers: int, requested: Mapping[str, int]
) -> int:
    if node.allocatable is None or workers == 0:
        return workers
    pods = resource_room(node.allocatable, requested, req.constraints.resource_map())
    return workers if pods is None else min(workers, pods)


def capacity_if_empty(node: NodeState, req: WorkerRequest) -> int:
    """Workers of `req` a node that passed the static checks could hold with nothing else on
    it: the planner's room on an empty node, to decide whether a gang can ever fit."""
    memory = req.opportunistic_memory_mib
    healthy = [
        g.index
        for g in node.gpus
        if g.gpu.healthy and (req.guaranteed or (g.share_slots >= 1 and g.gpu.memory_mib >= memory))
    ]
    return _bounded_by_resources(node, req, _workers_on(node, req, healthy), {})


def filter_worker(node: NodeState, req: WorkerRequest) -> Rejection | None:
    """None when one worker fits on the node; otherwise the reason it does not."""
    static = static_rejection(node, req)
    if static is not None:
        return static
    if _room(node, req) >= 1:
        return None
    if node.allocatable is not None and _gpu_room(node, req, frozenset()) >= 1:
        short = short_resource(node.allocatable, node.requested, req.constraints.resource_map())
        return Rejection(node.name, short or "not enough resources left for a worker")
    usable = usable_gpus(node, req)
    if req.guaranteed:
        if len(usable) < req.gpus:
            return Rejection(
                node.name,
                f"{len(usable)} of {_plural(node.gpu_count, 'GPU')} free, worker needs {req.gpus}",
            )
    elif len(usable) < req.gpus:
        return Rejection(
            node.name,
            f"{_plural(len(usable), 'GPU')} with {req.opportunistic_memory_mib} MiB spare "
            f"and a free share slot, worker needs {req.gpus}",
        )
    usable_set = set(usable)
    best = max(sum(1 for i in island if i in usable_set) for island in node.islands)
    return Rejection(
        node.name,
        f"{len(usable)} GPUs fit but at most {best} in one NVLink island, "
        f"worker needs {req.gpus} in one island",
    )
