"""A gang's companion pod sets placed beside its workers, all or nothing with them (pure).

plan_gang places the workers first; each companion set then goes, in order, onto the cluster
with everything placed before it held:
- a GPU set pod by pod on nodes with room for it, its GPUs chosen as a worker's are;
- a CPU-only set pod by pod where its CPU, memory and constraints fit.
Both try the gang's own nodes first, then its racks, then the rest by name: a launcher or a
driver talks to the workers, and a gang kept together leaves whole nodes free. A Required
Node or Rack scope keeps every set on the workers' node or rack(s). The holds are undone
before returning: planning leaves the cluster as it found it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gangshare.core.choose import choose_gpus
from gangshare.core.cluster import AllocationError, Cluster
from gangshare.core.fit import node_rejection, pods_room, static_rejection, worker_capacity
from gangshare.core.job import GangRequest, PodSet, Topology, TopologyPolicy, TopologyScope
from gangshare.core.node import NodeState

# (node, GPU indices) of one pod; a CPU-only pod's indices are empty.
Placed = tuple[str, tuple[int, ...]]


def plan_companions(
    cluster: Cluster, gang: GangRequest, workers: Sequence[Placed], topology: Topology
) -> list[Placed] | str:
    """Where each companion pod goes (in rank order), or why one set finds no room."""
    if not gang.companions:
        return []
    holder = f"{gang.owner}\0planning"
    found = list(workers)
    try:
        for rank, (node, gpus) in enumerate(workers):
            _hold(cluster, gang, holder, rank, node, gpus)
        for pod_set in gang.companions:
            placed = _place_set(cluster, gang, pod_set, found, topology, holder)
            if isinstance(placed, str):
                return placed
    except AllocationError as err:  # capacity said yes; a disagreement is a bug worth surfacing
        return f"internal: {err}"
    finally:
        cluster.release(holder)
    return found[len(workers) :]


def companions_never_fit(cluster: Cluster, gang: GangRequest) -> str | None:
    """Why some companion set could not be placed even on an empty cluster; None otherwise."""
    for pod_set in gang.companions:
        room = 0
        for node in cluster.nodes.values():
            if pod_set.gpus:
                req = gang.companion_request(pod_set, TopologyPolicy.NONE)
                room += 0 if static_rejection(node, req) is not None else node.gpu_count
                continue
            if node_rejection(node, pod_set.constraints) is None:
                fits = pods_room(node, pod_set.constraints, empty=True)
                room += pod_set.count if fits is None else fits
        need = pod_set.count * max(pod_set.gpus, 1)
        if room < need:
            return f"can never fit: {_ask(pod_set)}, the whole cluster holds at most {room}" + (
                " GPU(s)" if pod_set.gpus else " such pod(s)"
            )
    return None


def _ask(pod_set: PodSet) -> str:
    if pod_set.gpus:
        return f"pod set {pod_set.name} needs {pod_set.count} pod(s) x {pod_set.gpus} GPU(s)"
    return f"pod set {pod_set.name} needs {pod_set.count} CPU-only pod(s)"


def _hold(
    cluster: Cluster, gang: GangRequest, holder: str, rank: int, node: str, gpus: tuple[int, ...]
) -> None:
    pod_set = gang.pod_set_of(rank)
    memory = gang.gpu_memory_mib if gpus and not gang.worker().guaranteed else None
    cluster.allocate(
        holder,
        f"{holder}/{rank}",
        node,
        gpus,
        gang.service_class,
        memory,
        pod_set.constraints.resource_map(),
    )


def _place_set(
    cluster: Cluster,
    gang: GangRequest,
    pod_set: PodSet,
    found: list[Placed],
    topology: Topology,
    holder: str,
) -> str | None:
    """Place every pod of the set, holding each as it goes; a reason when one finds no room."""
    island_passes = [topology.island_policy]
    if topology.island_policy is TopologyPolicy.PREFERRED:
        island_passes = [TopologyPolicy.REQUIRED, TopologyPolicy.NONE]
    start = len(found)
    for island in island_passes if pod_set.gpus else [TopologyPolicy.NONE]:
        req = gang.companion_request(pod_set, island) if pod_set.gpus else None
        for node in _preferred_nodes(cluster, found[:start], topology):
            while len(found) - start < pod_set.count:
                if req is None:
                    room = 0 if node_rejection(node, pod_set.constraints) else 1
                    fits = pods_room(node, pod_set.constraints) if room else 0
                    gpus: tuple[int, ...] | None = () if fits is None or fits >= 1 else None
                else:
                    gpus = choose_gpus(node, req) if worker_capacity(node, req) >= 1 else None
                if gpus is None:
                    break
                _hold(cluster, gang, holder, len(found), node.name, gpus)
                found.append((node.name, gpus))
            if len(found) - start == pod_set.count:
                return None
        # This pass fell short: undo its pods and try the looser island policy.
        for rank in range(start, len(found)):
            cluster.release_worker(holder, f"{holder}/{rank}")
        del found[start:]
    scoped = topology.policy is TopologyPolicy.REQUIRED and topology.scope in (
        TopologyScope.NODE,
        TopologyScope.RACK,
    )
    where = f" in the gang's {topology.scope.value.lower()} (topology Required)" if scoped else ""
    return f"{_ask(pod_set)}: no room for all of them{where} beside the gang's workers"


def _preferred_nodes(
    cluster: Cluster, found: list[Placed], topology: Topology
) -> Iterator[NodeState]:
    """The nodes a companion may use, lazily: the gang's own first (most of its pods first),
    then the rest of its racks', then every other node, each in the cluster's order. Lazy,
    since the gang's own nodes mostly have room: a scan of 5,000 nodes per set is what a
    sort of them all cost."""
    on_node: dict[str, int] = {}
    for placed_on, _ in found:
        on_node[placed_on] = on_node.get(placed_on, 0) + 1
    for name in sorted(on_node, key=lambda n: (-on_node[n], n)):
        yield cluster.nodes[name]
    required = topology.policy is TopologyPolicy.REQUIRED
    if required and topology.scope is TopologyScope.NODE:
        return
    racks = {cluster.node(n).rack for n in on_node}
    for node in cluster.nodes.values():
        if node.rack in racks and node.name not in on_node:
            yield node
    if required and topology.scope is TopologyScope.RACK:
        return
    for node in cluster.nodes.values():
        if node.rack not in racks:
            yield node
