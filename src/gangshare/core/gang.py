"""All-or-nothing gang planning across nodes.

Phases, tightest first, each one only when the previous found nothing:
  1. one node (best-fit: the node whose room is closest to the gang);
  2. one rack (fewest nodes, then least room left over);
  3. the whole cluster (fewest nodes, then fewest racks).
A Required scope stops at its own phase. Island-local workers are tried before
workers that span NVLink islands when the island policy is Preferred.
Either every worker gets GPUs in the plan, or the answer is Unschedulable. A gang's other
pod sets (core/podsets.py) are placed once its workers are, all or nothing with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gangshare.core.choose import choose_gpus
from gangshare.core.cluster import AllocationError, Cluster
from gangshare.core.fit import capacity_if_empty, static_rejection
from gangshare.core.job import (
    GangRequest,
    Topology,
    TopologyPolicy,
    TopologyScope,
    WorkerRequest,
)
from gangshare.core.node import NodeState
from gangshare.core.podsets import companions_never_fit, plan_companions
from gangshare.core.verdicts import by_opportunistic_bound, room_of, score_of


@dataclass(frozen=True)
class WorkerPlacement:
    rank: int
    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class GangPlan:
    owner: str
    placements: tuple[WorkerPlacement, ...]
    # True when the gang's Preferred topology could not be met and was relaxed.
    relaxed: bool = False

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(p.node for p in self.placements))

    def racks(self, cluster: Cluster) -> list[str]:
        return sorted({cluster.node(n).rack for n in self.nodes})


@dataclass(frozen=True)
class Unschedulable:
    owner: str
    reason: str


Candidate = tuple[NodeState, int]


def plan_gang(
    cluster: Cluster, gang: GangRequest, waited_seconds: float = 0.0
) -> GangPlan | Unschedulable:
    topology = gang.topology.effective(waited_seconds)
    island = topology.island_policy
    passes = (
        [island]
        if island is not TopologyPolicy.PREFERRED
        else [TopologyPolicy.REQUIRED, TopologyPolicy.NONE]
    )
    widest = TopologyScope.NVLINK  # NVLink-scoped gangs may still span nodes and racks
    if topology.policy is TopologyPolicy.REQUIRED and topology.scope is not TopologyScope.NVLINK:
        widest = topology.scope
    for attempt, island_policy in enumerate(passes):
        req = gang.worker(island_policy)
        chosen = _choose_nodes(cluster, req, gang.workers, widest)
        if chosen is not None:
            relaxed = attempt > 0 or (
                gang.topology.policy is TopologyPolicy.REQUIRED
                and topology.policy is not TopologyPolicy.REQUIRED
            )
            plan = _assign_gpus(gang.owner, req, chosen, relaxed)
            return (
                plan
                if isinstance(plan, Unschedulable)
                else _with_companions(cluster, gang, plan, topology)
            )
    return Unschedulable(gang.owner, _explain(cluster, gang, gang.worker(passes[-1]), widest))


def _with_companions(
    cluster: Cluster, gang: GangRequest, plan: GangPlan, topology: Topology
) -> GangPlan | Unschedulable:
    """The workers' plan with the gang's other pod sets placed beside it, or why they find
    no room (the whole gang then waits: all or nothing)."""
    if not gang.companions:
        return plan
    workers = [(p.node, p.gpu_indices) for p in plan.placements]
    placed = plan_companions(cluster, gang, workers, topology)
    if isinstance(placed, str):
        return Unschedulable(gang.owner, placed)
    more = tuple(
        WorkerPlacement(rank, node, gpus)
        for rank, (node, gpus) in enumerate(placed, start=len(workers))
    )
    return GangPlan(plan.owner, plan.placements + more, plan.relaxed)


def apply_plan(cluster: Cluster, gang: GangRequest, plan: GangPlan) -> None:
    """Allocate every pod of the plan, or none of them."""
    resources = gang.constraints.resource_map()
    memory = gang.gpu_memory_mib if not gang.worker().guaranteed else None
    try:
        for placement in plan.placements:
            own = resources
            if placement.rank >= gang.workers:
                own = gang.pod_set_of(placement.rank).constraints.resource_map()
            cluster.allocate(
                gang.owner,
                f"{gang.owner}/{placement.rank}",
                placement.node,
                placement.gpu_indices,
                gang.service_class,
                memory if placement.gpu_indices else None,
                own,
            )
    except AllocationError:
        cluster.release(gang.owner)
        raise


def never_fits(cluster: Cluster, gang: GangRequest) -> str | None:
    """Why the gang could not be placed even on an empty cluster; None when it could.

    Waiting cannot help such a job, so it must not hold its queue's head. A topology
    that relaxes after a while is judged relaxed: waiting does help it.
    """
    topology = gang.topology
    if topology.relax_after_seconds is not None:
        topology = topology.relaxed()
    req = gang.worker(topology.island_policy)
    total = 0
    per_rack: dict[str, int] = {}
    largest = 0
    reasons: dict[str, int] = {}
    for node in cluster.nodes.values():
        rejection = static_rejection(node, req)
        room = 0 if rejection is not None else capacity_if_empty(node, req)
        if room == 0:
            reason = rejection.reason if rejection else "too little room for one worker"
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        total += room
        largest = max(largest, room)
        per_rack[node.rack] = per_rack.get(node.rack, 0) + room
        if _enough(topology, gang.workers, total, largest, per_rack[node.rack]):
            # Found room for the whole gang: the reasons other nodes refuse are not needed.
            return companions_never_fit(cluster, gang)
    ask = f"{gang.workers} worker(s) x {gang.gpus_per_worker} GPU(s)"
    why = ""
    if reasons:
        # As kube-scheduler words it: the commonest reasons first, with how many nodes each.
        ranked = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))[:3]
        shown = "; ".join(f"{count}: {reason}" for reason, count in ranked)
        more = "; ..." if len(reasons) > 3 else ""
        why = (
            f"; {sum(reasons.values())} of {len(cluster.nodes)} node(s) cannot take one "
            f"({shown}{more})"
        )
    required = topology.policy is TopologyPolicy.REQUIRED
    if total < gang.workers:
        return f"can never fit: {ask}, the whole cluster holds at most {total} even when empty{why}"
    if required and topology.scope is TopologyScope.NODE and largest < gang.workers:
        return (
            f"can never fit: {ask} on one node (topology Node, Required), "
            f"the largest holds {largest}{why}"
        )
    if required and topology.scope is TopologyScope.RACK and max(per_rack.values()) < gang.workers:
        return (
            f"can never fit: {ask} in one rack (topology Rack, Required), "
            f"the largest rack holds {max(per_rack.values())}{why}"
        )
    return companions_never_fit(cluster, gang)


def _enough(topology: Topology, workers: int, total: int, largest: int, in_rack: int) -> bool:
    if topology.policy is not TopologyPolicy.REQUIRED:
        return total >= workers
    if topology.scope is TopologyScope.NODE:
        return largest >= workers
    if topology.scope is TopologyScope.RACK:
        return in_rack >= workers
    return total >= workers


# ----- phase 1..3: which nodes, how many workers each ------------------------------------------


def _choose_nodes(
    cluster: Cluster, req: WorkerRequest, workers: int, widest: TopologyScope
) -> list[Candidate] | None:
    single = _one_node(cluster, req, workers)
    if single is not None or widest is TopologyScope.NODE:
        return single
    candidates = _candidates(cluster, req)
    if sum(cap for _, cap in candidates) < workers:
        return None
    by_rack: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        by_rack.setdefault(candidate[0].rack, []).append(candidate)
    in_rack = _one_rack(by_rack, workers)
    if in_rack is not None or widest is TopologyScope.RACK:
        return in_rack
    return _fewest_racks(by_rack, workers)


def _candidates(cluster: Cluster, req: WorkerRequest) -> list[Candidate]:
    kept = cluster.kept_verdicts(req)
    found = []
    for node in _may_fit(cluster, req):
        capacity = room_of(cluster, node, req, kept)
        if capacity > 0:
            found.append((node, capacity))
    return found


def _may_fit(cluster: Cluster, req: WorkerRequest, workers: int = 1) -> Iterable[NodeState]:
    """The only nodes with GPUs for `workers` workers of `req` now (other checks aside)."""
    if req.guaranteed:
        return cluster.nodes_with_free_at_least(req.gpus * workers)
    return cluster.open_to_opportunistic(req.gpus * workers, req.opportunistic_memory_mib)


def _one_node(cluster: Cluster, req: WorkerRequest, workers: int) -> list[Candidate] | None:
    kept = cluster.kept_verdicts(req)
    if req.guaranteed:
        # The index yields the tightest nodes first, so the first fit is the best fit.
        for node in _may_fit(cluster, req, workers):
            if room_of(cluster, node, req, kept) >= workers:
                return [(node, workers)]
        return None
    memory = req.opportunistic_memory_mib
    if next(iter(_may_fit(cluster, req, workers)), None) is None:
        return None  # a packed cluster: no node to judge
    if req.gpus == 1:
        # Branch and bound: nodes by the most a 1-GPU worker could score there (name breaks
        # ties, as the score does); once that cannot beat the best found, nothing later can.
        best: tuple[float, str] | None = None
        for bound, name in by_opportunistic_bound(cluster):
            if best is not None and (bound, name) > best:
                break
            if not cluster.may_share(name, workers, memory):
                continue
            node = cluster.nodes[name]
            if room_of(cluster, node, req, kept) >= workers:
                key = (-score_of(cluster, node, req, kept), name)
                if best is None or key < best:
                    best = key
        return None if best is None else [(cluster.nodes[best[1]], workers)]
    # Wider workers have no cheap bound: every node, the best score, then the name.
    found = min(
        (
            (-score_of(cluster, node, req, kept), node.name)
            for node in _may_fit(cluster, req, workers)
            if room_of(cluster, node, req, kept) >= workers
        ),
        default=None,
    )
    return None if found is None else [(cluster.nodes[found[1]], workers)]


def _fewest_nodes(candidates: list[Candidate], workers: int) -> list[Candidate] | None:
    """Largest rooms first (fewest nodes); the last node is the tightest that finishes."""
    pool = sorted(candidates, key=lambda c: (-c[1], c[0].name))
    chosen: list[Candidate] = []
    remaining = workers
    while remaining > 0 and pool:
        finishing = [c for c in pool if c[1] >= remaining]
        if finishing:
            node, _ = min(finishing, key=lambda c: (c[1], c[0].name))
            chosen.append((node, remaining))
            return chosen
        node, capacity = pool.pop(0)
        chosen.append((node, capacity))
        remaining -= capacity
    return None


def _leftover(chosen: list[Candidate], candidates: list[Candidate]) -> int:
    room = {c[0].name: c[1] for c in candidates}
    return sum(room[node.name] - used for node, used in chosen)


def _one_rack(by_rack: dict[str, list[Candidate]], workers: int) -> list[Candidate] | None:
    best: tuple[int, int, str] | None = None
    best_plan: list[Candidate] | None = None
    for rack, candidates in by_rack.items():
        plan = _fewest_nodes(candidates, workers)
        if plan is None:
            continue
        key = (len(plan), _leftover(plan, candidates), rack)
        if best is None or key < best:
            best, best_plan = key, plan
    return best_plan


def _fewest_racks(by_rack: dict[str, list[Candidate]], workers: int) -> list[Candidate] | None:
    everything = [c for group in by_rack.values() for c in group]
    anywhere = _fewest_nodes(everything, workers)
    if anywhere is None:
        return None
    racks = sorted(by_rack, key=lambda r: (-sum(c[1] for c in by_rack[r]), r))
    union: list[Candidate] = []
    for rack in racks:
        union.extend(by_rack[rack])
        plan = _fewest_nodes(union, workers)
        if plan is not None and len(plan) == len(anywhere):
            return plan
    return anywhere


# ----- GPUs for each worker ------------------------------------------------------------------


def _assign_gpus(
    owner: str, req: WorkerRequest, chosen: list[Candidate], relaxed: bool
) -> GangPlan | Unschedulable:
    placements: list[WorkerPlacement] = []
    ordered = sorted(chosen, key=lambda c: (c[0].rack, -c[1], c[0].name))
    for node, count in ordered:
        taken: frozenset[int] = frozenset()
        for _ in range(count):
            gpus = choose_gpus(node, req, taken)
            if gpus is None:  # capacity said yes; a disagreement is a bug worth surfacing
                return Unschedulable(owner, f"internal: node {node.name} lost room for a worker")
            taken = taken.union(gpus)
            placements.append(WorkerPlacement(len(placements), node.name, gpus))
    return GangPlan(owner, tuple(placements), relaxed)


def _explain(cluster: Cluster, gang: GangRequest, req: WorkerRequest, widest: TopologyScope) -> str:
    ask = f"needs {gang.workers} worker(s) x {gang.gpus_per_worker} GPU(s) ({gang.service_class})"
    candidates = _candidates(cluster, req)
    room = sum(cap for _, cap in candidates)
    total = len(cluster.nodes)
    if req.guaranteed:
        short = total - cluster.count_with_free_at_least(req.gpus)
        detail = f"{short} of {total} nodes have fewer than {req.gpus} free GPU(s)"
    else:
        detail = f"{total - len(candidates)} of {total} nodes lack spare memory or share slots"
    where = f"room for {room} worker(s) on {len(candidates)} node(s)"
    if room >= gang.workers and widest is TopologyScope.NODE:
        where += "; no single node holds the whole gang (topology Node, Required)"
    elif room >= gang.workers and widest is TopologyScope.RACK:
        where += "; no single rack holds the whole gang (topology Rack, Required)"
    return f"{ask}: {where}; {detail}"
