"""What one scheduling cycle judged of a node for a worker request, kept until the node changes.

Placement judges nodes one at a time (room for the request's workers, then a score), and a
borrower's placement, which has no index to its best node, judges every node. Within one cycle
(`Cluster.verdicts_kept`) the answers are kept per request and node and judged again only once
allocate or release has changed that node, so they are the answers judging afresh would give.
Outside a cycle (`kept` None) every call judges afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gangshare.core.cluster import Cluster, Verdict
from gangshare.core.fit import worker_capacity
from gangshare.core.job import WorkerRequest
from gangshare.core.node import NodeState
from gangshare.core.score import opportunistic_bound, score_worker

Kept = dict[str, Verdict] | None


def room_of(cluster: Cluster, node: NodeState, req: WorkerRequest, kept: Kept) -> int:
    """worker_capacity(node, req), kept for the cycle."""
    if kept is None:
        return worker_capacity(node, req)
    stamp = cluster.changes(node.name)
    verdict = kept.get(node.name)
    if verdict is None or verdict[0] != stamp:
        verdict = kept[node.name] = (stamp, worker_capacity(node, req), None)
    return verdict[1]


def score_of(cluster: Cluster, node: NodeState, req: WorkerRequest, kept: Kept) -> float:
    """score_worker(node, req), kept for the cycle beside the room (asked once room_of was)."""
    if kept is None:
        return score_worker(node, req)
    stamp, room, score = kept[node.name]
    if score is None:
        score = score_worker(node, req) if room else 0.0
        kept[node.name] = (stamp, room, score)
    return score


@dataclass
class _BoundOrder:
    version: int = -1
    order: list[tuple[float, str]] = field(default_factory=list)
    bounds: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (stamp, bound)


def by_opportunistic_bound(cluster: Cluster) -> list[tuple[float, str]]:
    """(-bound, name) of every node, best bound first, where the bound is the most a 1-GPU
    opportunistic worker could score there (core/score.py): a placement visits nodes in this
    order and stops once no later node can beat the best found.

    Kept across cycles, each node's bound judged again only once its change count moved
    (allocate, release, `Cluster.touch` for a measured change) and the order sorted again only
    after some node changed: a replay's cycle admits a few jobs, and judging every node for
    each borrower was most of a full-stack replay's time (#40)."""
    kept = cluster.kept_while_nodes_stand("opportunistic-bound", _BoundOrder)
    if kept.version != cluster.version:
        bounds = kept.bounds
        for name, node in cluster.nodes.items():
            stamp = cluster.changes(name)
            known = bounds.get(name)
            if known is None or known[0] != stamp:
                bounds[name] = (stamp, opportunistic_bound(node))
        kept.order = sorted((-bounds[name][1], name) for name in cluster.nodes)
        kept.version = cluster.version
    return kept.order


def stale_bounds(cluster: Cluster) -> list[str]:
    """Nodes whose kept bound is not what judging afresh gives: a change made in place that
    nobody told the cluster of (`Cluster.touch`). The simulator's invariant checks ask."""
    kept = cluster.kept_while_nodes_stand("opportunistic-bound", _BoundOrder)
    return [
        name
        for name, (stamp, bound) in kept.bounds.items()
        if name in cluster.nodes
        and stamp == cluster.changes(name)
        and bound != opportunistic_bound(cluster.nodes[name])
    ]
