"""Which GPUs on a chosen node a worker gets.

Guaranteed workers: the tightest NVLink island that holds the whole worker, so
larger islands stay free for larger workers; GPUs without opportunistic
tenants first, so the worker starts at solo speed. Opportunistic workers: the
least-loaded GPUs with spare memory and a free share slot.
"""

from __future__ import annotations

from gangshare.core.fit import usable_gpus
from gangshare.core.job import TopologyPolicy, WorkerRequest
from gangshare.core.node import NodeState


def choose_gpus(
    node: NodeState, req: WorkerRequest, exclude: frozenset[int] = frozenset()
) -> tuple[int, ...] | None:
    """The GPU indices for one worker, or None when it does not fit."""
    usable = usable_gpus(node, req, exclude)
    if len(usable) < req.gpus:
        return None
    if req.guaranteed:
        return _choose_guaranteed(node, req, set(usable))
    return _choose_opportunistic(node, req, usable)


def _solo_first(node: NodeState, indices: list[int]) -> list[int]:
    return sorted(indices, key=lambda i: (len(node.gpus[i].opportunistic), i))


def _choose_guaranteed(
    node: NodeState, req: WorkerRequest, usable: set[int]
) -> tuple[int, ...] | None:
    per_island = [[i for i in island if i in usable] for island in node.islands]
    holding = [free for free in per_island if len(free) >= req.gpus]
    if holding:
        picks = [_solo_first(node, free)[: req.gpus] for free in holding]

        def tightness(i: int) -> tuple[int, int, int]:
            shared = sum(1 for g in picks[i] if node.gpus[g].opportunistic)
            return (len(holding[i]), shared, holding[i][0])

        return tuple(sorted(picks[min(range(len(holding)), key=tightness)]))
    if req.island_policy is TopologyPolicy.REQUIRED:
        return None
    # Span as few islands as possible: fill from the fullest islands down.
    chosen: list[int] = []
    for free in sorted(per_island, key=lambda f: (-len(f), f[0] if f else -1)):
        chosen.extend(_solo_first(node, free)[: req.gpus - len(chosen)])
        if len(chosen) == req.gpus:
            return tuple(sorted(chosen))
    return None


def _choose_opportunistic(
    node: NodeState, req: WorkerRequest, usable: list[int]
) -> tuple[int, ...] | None:
    def load_key(i: int) -> tuple[float, int, int]:
        gpu = node.gpus[i]
        return (gpu.load(), len(gpu.opportunistic), i)

    ranked = sorted(usable, key=load_key)
    if req.gpus == 1 or req.island_policy is TopologyPolicy.NONE:
        return tuple(sorted(ranked[: req.gpus]))
    usable_set = set(usable)
    options = []
    for island in node.islands:
        members = sorted((i for i in island if i in usable_set), key=load_key)
        if len(members) >= req.gpus:
            picked = members[: req.gpus]
            options.append((sum(node.gpus[i].load() for i in picked), picked[0], picked))
    if options:
        return tuple(sorted(min(options)[2]))
    if req.island_policy is TopologyPolicy.REQUIRED:
        return None
    return tuple(sorted(ranked[: req.gpus]))
