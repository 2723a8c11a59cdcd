"""Node scores for one worker, 0..1, higher is better.

Guaranteed: best-fit bin-packing (the node left with the fewest free GPUs
wins, keeping whole nodes free for large gangs), plus NVLink locality and a
preference for GPUs nobody shares. Opportunistic: the least-loaded GPUs.
"""

from __future__ import annotations

from gangshare.core.choose import choose_gpus
from gangshare.core.fit import worker_capacity
from gangshare.core.job import WorkerRequest
from gangshare.core.node import NodeState

BIN_PACKING_WEIGHT = 0.6
ISLAND_WEIGHT = 0.25
SOLO_WEIGHT = 0.15
IDLE_WEIGHT = 0.8
SPARE_WEIGHT = 0.2


def score_worker(node: NodeState, req: WorkerRequest) -> float:
    """How good a home the node is for one worker; 0 when it does not fit."""
    if worker_capacity(node, req) < 1:
        return 0.0
    if req.guaranteed:
        return _score_guaranteed(node, req)
    return _score_opportunistic(node, req)


def _score_guaranteed(node: NodeState, req: WorkerRequest) -> float:
    free_after = node.free_guaranteed - req.gpus
    packing = 1.0 - free_after / node.gpu_count
    chosen = choose_gpus(node, req) or ()
    islands = {node.island_of(i) for i in chosen}
    island = 1.0 if len(islands) == 1 else 1.0 / max(1, len(islands))
    if req.gpus == 1:
        # A single GPU is always island-local; reward leaving whole islands intact instead.
        (only,) = islands or {()}
        free_in_island = sum(1 for i in only if node.gpus[i].free_for_guaranteed)
        island = 1.0 - (free_in_island - 1) / max(1, len(only))
    solo = sum(1 for i in chosen if not node.gpus[i].opportunistic) / max(1, len(chosen))
    return BIN_PACKING_WEIGHT * packing + ISLAND_WEIGHT * island + SOLO_WEIGHT * solo


def _score_opportunistic(node: NodeState, req: WorkerRequest) -> float:
    chosen = choose_gpus(node, req)
    if not chosen:
        return 0.0
    gpus = [node.gpus[i] for i in chosen]
    idle = 1.0 - sum(g.load() for g in gpus) / len(gpus)
    spare = sum(g.spare_memory_mib() / g.gpu.memory_mib for g in gpus) / len(gpus)
    return IDLE_WEIGHT * max(0.0, idle) + SPARE_WEIGHT * spare


def opportunistic_bound(node: NodeState) -> float:
    """The most a 1-GPU opportunistic worker can score on the node, without memory arithmetic.

    Exact in floating point for one GPU: its load is at least the node's least load and
    its spare share at most 1.0, and the same operations round the same way.
    """
    loads = [g.load() for g in node.gpus if g.gpu.healthy]
    if not loads:
        return 0.0
    return IDLE_WEIGHT * max(0.0, 1.0 - min(loads)) + SPARE_WEIGHT * 1.0


def to_extender_score(score: float, max_priority: int = 10) -> int:
    """kube-scheduler extenders answer integer scores 0..MaxExtenderPriority."""
    return max(0, min(max_priority, round(score * max_priority)))
