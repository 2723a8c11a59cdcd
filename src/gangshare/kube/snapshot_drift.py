"""Where a snapshot kept from changes differs from one rebuilt from everything (pure).

The operator's audit (operator/standing_view.py) rebuilds now and then and compares: each
difference is a short line naming what drifted, for a log line and a metric label. Order is
not compared (node order, running-job order, which of two free GPUs a tie picked first are
the same state), nor what the rebuild could not know (measured node versions).
"""

from __future__ import annotations

from typing import Any

from gangshare.core.cluster import Cluster
from gangshare.core.node import NodeState
from gangshare.kube.snapshot import Snapshot

# How often the operator audits by default (--snapshot-audit-seconds).
AUDIT_SECONDS = 120.0
# The kinds of drift, each a metric label.
DRIFT_KINDS = (
    "nodes",
    "allocations",
    "requests",
    "running",
    "displaced",
    "warnings",
    "trainingjobs",  # the operator's kept TrainingJob counts (operator/job_counts.py)
)


def snapshot_drift(kept: Snapshot, rebuilt: Snapshot) -> list[tuple[str, str]]:
    """(kind, what) for every difference between the two; empty when they agree."""
    found: list[tuple[str, str]] = []
    a, b = kept.cluster.nodes, rebuilt.cluster.nodes
    for name in sorted(a.keys() ^ b.keys()):
        found.append(("nodes", f"node {name}: {'kept only' if name in a else 'rebuilt only'}"))
    for name in sorted(a.keys() & b.keys()):
        if _node(a[name]) != _node(b[name]):
            found.append(("nodes", f"node {name}: its state differs"))
        if _requested(a[name]) != _requested(b[name]):
            found.append(
                (
                    "requests",
                    f"node {name}: requests {_requested(a[name])} kept, "
                    f"{_requested(b[name])} rebuilt",
                )
            )
    held_a, held_b = _allocations(kept.cluster), _allocations(rebuilt.cluster)
    for owner in sorted(held_a.keys() | held_b.keys()):
        if held_a.get(owner) != held_b.get(owner):
            found.append(("allocations", f"{owner}: holds differ"))
    running_a = {r.key: r for r in kept.running}
    running_b = {r.key: r for r in rebuilt.running}
    for key in sorted(running_a.keys() | running_b.keys()):
        if running_a.get(key) != running_b.get(key):
            found.append(("running", f"{key}: running record differs"))
    for key in sorted(kept.displaced.keys() | rebuilt.displaced.keys()):
        if kept.displaced.get(key) != rebuilt.displaced.get(key):
            found.append(("displaced", f"{key}: displacement differs"))
    for key in sorted(kept.off_island.keys() | rebuilt.off_island.keys()):
        if kept.off_island.get(key) != rebuilt.off_island.get(key):
            found.append(("displaced", f"{key}: off-island verdict differs"))
    for line in sorted(set(kept.warnings) ^ set(rebuilt.warnings)):
        found.append(("warnings", line))
    return found


def _node(node: NodeState) -> tuple[Any, ...]:
    gpus = [
        (
            g.gpu,
            g.guaranteed,
            sorted(map(repr, g.opportunistic)),
            g.utilization,
            g.memory_used_mib,
            g.share_slots,
        )
        for g in node.gpus
    ]
    return (
        gpus,
        node.islands,
        node.rack,
        dict(node.labels),
        node.unschedulable_reason,
        node.taints,
        None if node.allocatable is None else dict(node.allocatable),
        node.free_guaranteed,
    )


def _requested(node: NodeState) -> dict[str, int]:
    return {name: amount for name, amount in node.requested.items() if amount}


def _allocations(cluster: Cluster) -> dict[str, list[str]]:
    return {owner: sorted(map(repr, cluster.allocations_of(owner))) for owner in cluster.owners()}
