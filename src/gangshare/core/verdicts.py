"""What one scheduling cycle judged of a node for a worker request, kept until the node changes.

Placement judges nodes one at a time (room for the request's workers, then a score), and a
borrower's placement, which has no index to its best node, judges every node. Within one cycle
(`Cluster.verdicts_kept`) the answers are kept per request and node and judged again only once
allocate or release has changed that node, so they are the answers judging afresh would give.
Outside a cycle (`kept` None) every call judges afresh.
"""

from __future__ import annotations

from gangshare.core.cluster import Cluster, Verdict
from gangshare.core.fit import worker_capacity
from gangshare.core.job import WorkerRequest
from gangshare.core.node import NodeState
from gangshare.core.score import score_worker

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
