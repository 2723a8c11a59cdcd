"""Holding a node's claims: each on its recorded GPUs if they are still free, else why not (pure).

A plan must get exactly its planned GPUs on a node that still takes it; a fact or an
assumption whose recorded GPUs are gone is still counted, on whatever GPUs the core would give
it, so a pod the kubelet may run is never forgotten. A node's claims are held in one order:
recorded facts, assumptions, plans, then facts with no GPUs recorded; if one of those finds no
room that way, every fact goes first after all (kube/ledger.py says why).
"""

from __future__ import annotations

from gangshare.core.choose import choose_gpus
from gangshare.core.cluster import AllocationError, Cluster
from gangshare.core.constraints import UNCONSTRAINED
from gangshare.core.fit import node_rejection, static_rejection
from gangshare.core.job import ServiceClass, WorkerRequest
from gangshare.core.node import NodeState
from gangshare.kube.claims import Claim, ClaimKind


def hold_claim(cluster: Cluster, claim: Claim) -> str | None:
    """Hold one claim on its node; None when held as recorded, else why not (or how else)."""
    node = cluster.nodes.get(claim.node)
    plan = claim.kind is ClaimKind.PLAN
    if node is None:
        return f"{'planned ' if plan else ''}node {claim.node} no longer exists"
    if claim.count == 0:
        return _hold_cpu_only(cluster, node, claim)
    request = WorkerRequest(
        claim.count,
        claim.service_class,
        gpu_memory_mib=claim.memory_mib,
        constraints=claim.constraints or UNCONSTRAINED,
    )
    if plan:
        unusable = static_rejection(node, request)
        if unusable is not None:
            return f"planned node {node.name}: {unusable.reason}"
        conflict = _plan_conflict(node, claim)
        if conflict is not None:
            return conflict
    indices = claim.indices
    if indices is not None and _allocate(cluster, claim, indices):
        return None
    if plan:
        return f"planned GPUs {list(claim.indices or ())} on {node.name} are no longer free"
    # A fact or assumption whose recorded GPUs are gone still uses that many: count it.
    fallback = choose_gpus(node, request)
    if fallback is not None and _allocate(cluster, claim, fallback):
        return (
            None
            if indices is None
            else f"recorded GPUs {list(indices)} taken; counted as {list(fallback)}"
        )
    return f"no room left on {node.name} for its {claim.count} GPU(s)"


def _hold_cpu_only(cluster: Cluster, node: NodeState, claim: Claim) -> str | None:
    """A gang's CPU-only pod (a launcher, a driver): a plan holds its CPU and memory on a node
    that still takes it; bound, the pod list counts them."""
    if claim.kind is ClaimKind.PLAN:
        unusable = node_rejection(node, claim.constraints or UNCONSTRAINED)
        if unusable is not None:
            return f"planned node {node.name}: {unusable.reason}"
    return None if _allocate(cluster, claim, ()) else f"cannot hold {claim.owner} on {node.name}"


def _allocate(cluster: Cluster, claim: Claim, indices: tuple[int, ...]) -> bool:
    try:
        cluster.allocate(
            claim.owner,
            claim.owner,
            claim.node,
            indices,
            claim.service_class,
            claim.memory_mib,
            dict(claim.resources) if claim.kind is ClaimKind.PLAN else None,
        )
    except AllocationError:
        return False
    return True


def _plan_conflict(node: NodeState, claim: Claim) -> str | None:
    """Why a plan's GPUs cannot be had on the node, naming who holds them."""
    for index in claim.indices or ():
        if not 0 <= index < node.gpu_count:
            return f"planned GPU {index} does not exist on {node.name}"
        gpu = node.gpus[index]
        if not gpu.gpu.healthy:
            return f"planned GPU {index} on {node.name} is unhealthy"
        holder = gpu.guaranteed
        if claim.service_class is ServiceClass.GUARANTEED and holder is not None:
            return f"planned GPU {index} on {node.name} is taken by {holder.owner}"
        if claim.service_class is ServiceClass.OPPORTUNISTIC and gpu.free_share_slots() < 1:
            return f"planned GPU {index} on {node.name} has no free share slot"
    return None


def hold_node_claims(cluster: Cluster, claims: list[Claim]) -> tuple[set[str], dict[str, str]]:
    """(owners held, owner -> why not as recorded) for one node's claims, in the ledger's order
    (the node's earlier allocations already released)."""
    unrecorded = {c.owner for c in claims if _unrecorded(c)}
    held, problems = _hold_in_order(cluster, sorted(claims, key=_plans_before_unrecorded))
    if unrecorded & problems.keys():
        for owner in held:
            cluster.release(owner)
        held, problems = _hold_in_order(cluster, sorted(claims, key=_facts_first))
    return held, problems


def _hold_in_order(cluster: Cluster, claims: list[Claim]) -> tuple[set[str], dict[str, str]]:
    held: set[str] = set()
    problems: dict[str, str] = {}
    for claim in claims:
        problem = hold_claim(cluster, claim)
        if problem is None:
            held.add(claim.owner)
        else:
            problems[claim.owner] = problem
            if cluster.allocations_of(claim.owner):
                held.add(claim.owner)  # held by count, under a warning
    return held, problems


def _unrecorded(claim: Claim) -> bool:
    """A bound pod whose GPUs nobody recorded: the default binder placed it and no node agent
    has read the kubelet's choice back (yet), so any GPUs of the count are as true as others."""
    return claim.kind is ClaimKind.FACT and claim.indices is None


def _facts_first(claim: Claim) -> tuple[ClaimKind, str]:
    return claim.kind, claim.owner


def _plans_before_unrecorded(claim: Claim) -> tuple[bool, ClaimKind, str]:
    # An unrecorded fact takes whatever GPUs the plans leave: a pod placed beside an admitted
    # gang must not break the gang's plan by the accident of which indices it is counted on.
    return _unrecorded(claim), claim.kind, claim.owner
