"""Guaranteed GPUs free and freeing, counted on the nodes a blocked head can run on.

A head's reservation promises it GPUs at the earliest time enough of them are free. Only
GPUs on nodes it can run on count (its GPU model, node selector and affinity, taints, by
the planner's own node filter): idle GPUs of another model do not bring its start nearer,
and a job placed on them does not delay it. Counting them cluster-wide kept 8 idle H100s
from a backfill job for hours because an A100 head was waiting for its only node.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from gangshare.core.cluster import Cluster
from gangshare.core.constraints import NAME_FIELD, Requirement, SelectorOperator, SelectorTerm
from gangshare.core.fit import static_rejection
from gangshare.core.gang import GangPlan
from gangshare.core.job import GangRequest, ServiceClass, WorkerRequest
from gangshare.core.queueing import RunningJob

# (expected end, GPUs), sorted by end.
Ending = tuple[float, int]
# None: every node of the cluster.
Nodes = frozenset[str] | None


def head_worker(gang: GangRequest) -> WorkerRequest:
    """One worker as the head will be placed once it may start: a topology that relaxes is
    judged relaxed (as never_fits judges it), so it is promised every node it may come to use."""
    topology = gang.topology
    if topology.relax_after_seconds is not None:
        topology = topology.relaxed()
    return gang.worker(topology.island_policy)


def usable_nodes(cluster: Cluster, worker: WorkerRequest) -> Nodes:
    """The nodes one worker could ever run on, by the placement's node filter; None when
    every node could (the common case, counted cluster-wide as before)."""
    usable = frozenset(
        name for name, node in cluster.nodes.items() if static_rejection(node, worker) is None
    )
    return None if len(usable) == len(cluster.nodes) else usable


def nodes_for(cluster: Cluster, gang: GangRequest) -> Nodes:
    """Where the gang's head worker could ever run, kept by the gang's identity while the
    nodes stand (node filters do not change in between)."""
    return cluster.kept_for("nodes-for", gang, lambda: _nodes_for(cluster, head_worker(gang)))


def _nodes_for(cluster: Cluster, worker: WorkerRequest) -> Nodes:
    # A one-element box: None (every node) is a value worth keeping too.
    [usable] = cluster.kept_while_nodes_stand(
        ("usable-nodes", worker), lambda: [usable_nodes(cluster, worker)]
    )
    return usable


def avoiding(gang: GangRequest, nodes: frozenset[str]) -> GangRequest:
    """The gang kept off `nodes`, as a required node affinity on the node's name: the planner
    then judges every other node exactly as it would for the gang itself."""
    off = _not_on(nodes)
    constraints = gang.constraints
    terms = tuple(replace(t, fields=(*t.fields, off)) for t in constraints.affinity)
    affinity = terms or (SelectorTerm(fields=(off,)),)
    return replace(gang, constraints=replace(constraints, affinity=affinity))


@lru_cache(maxsize=64)
def _not_on(nodes: frozenset[str]) -> Requirement:
    # Kept: one cycle keeps many jobs off the same heads' nodes.
    return Requirement(NAME_FIELD, SelectorOperator.NOT_IN, tuple(sorted(nodes)))


def gpus_by_node(plan: GangPlan) -> dict[str, int]:
    placed: dict[str, int] = {}
    for placement in plan.placements:
        placed[placement.node] = placed.get(placement.node, 0) + len(placement.gpu_indices)
    return placed


@dataclass
class _Held:
    """A guaranteed job holding GPUs: where (None when the snapshot does not say), how many,
    and when it is expected to free them."""

    queue: str
    end: float
    gpus: int
    borrowed: bool
    placed: Mapping[str, int] | None
    owner: str | None = None  # a running job's, until where it runs is looked up

    def gpus_on(self, nodes: Nodes) -> int:
        if nodes is None or self.placed is None:
            # Where it runs is unknown: counted as freeing the head's nodes, as before.
            return self.gpus
        return sum(n for name, n in self.placed.items() if name in nodes)


@dataclass
class _Scope:
    free: int
    endings: list[Ending] = field(default_factory=list)


class HeldGpus:
    """What one cycle knows of guaranteed GPUs: free now and expected ends, per set of nodes
    and per queue. Each is built when a reservation first asks (most cycles never do) and
    then kept as admissions add to it: rebuilding it for every blocked head made a large
    cycle quadratic."""

    def __init__(
        self, cluster: Cluster, running: Sequence[RunningJob], now: float, default_end: float
    ) -> None:
        self.cluster = cluster
        self._running = running
        self._now = now
        self._default_end = default_end
        self._running_held: list[_Held] | None = None
        self._located = False
        self._admitted: list[_Held] = []
        self._scopes: dict[Nodes, _Scope] = {}
        self._by_queue: dict[str, list[Ending]] | None = None
        # Bumped by every admission: what was computed from these counts holds until then.
        self.version = 0

    def free(self, nodes: Nodes) -> int:
        return self._scope(nodes).free

    def endings(self, nodes: Nodes) -> list[Ending]:
        return self._scope(nodes).endings

    def queue_endings(self, queue: str) -> list[Ending]:
        """Expected ends of the queue's own guaranteed jobs (borrowers spend no quota)."""
        if self._by_queue is None:
            self._by_queue = {}
            for job in self._running:
                if job.service_class is ServiceClass.GUARANTEED and not job.borrowed:
                    ending = (self._end_of(job), job.gpus)
                    self._by_queue.setdefault(job.queue, []).append(ending)
            for held in self._admitted:
                if not held.borrowed:
                    self._by_queue.setdefault(held.queue, []).append((held.end, held.gpus))
            for mine in self._by_queue.values():
                mine.sort()
        return self._by_queue.get(queue, [])

    def assumed(self, queue: str, placed: Mapping[str, int], end: float, borrowed: bool) -> None:
        """A guaranteed placement admitted in this cycle: it holds its GPUs until `end`."""
        held = _Held(queue, end, sum(placed.values()), borrowed, placed)
        self.version += 1
        self._admitted.append(held)
        for nodes, scope in self._scopes.items():
            gpus = held.gpus_on(nodes)
            if gpus:
                scope.free -= gpus
                insort(scope.endings, (end, gpus))
        if self._by_queue is not None and not borrowed:
            insort(self._by_queue.setdefault(queue, []), (end, held.gpus))

    def _scope(self, nodes: Nodes) -> _Scope:
        scope = self._scopes.get(nodes)
        if scope is None:
            if nodes is None:
                free = self.cluster.free_guaranteed_total()
            else:
                free = sum(self.cluster.nodes[name].free_guaranteed for name in nodes)
            if nodes is None:
                # Counted cluster-wide: no need to know where each holds its GPUs.
                ends = [*self._running_ends(), *((h.end, h.gpus) for h in self._admitted)]
            else:
                ends = [(h.end, h.gpus_on(nodes)) for h in self._all_held(located=True)]
            scope = self._scopes[nodes] = _Scope(free, sorted(e for e in ends if e[1]))
        return scope

    def _running_ends(self) -> list[Ending]:
        """(expected end, GPUs) of every guaranteed job running, without a _Held each: most
        cycles ask only this, and making one per running job was a tenth of a replay."""
        return [
            (self._end_of(job), job.gpus)
            for job in self._running
            if job.service_class is ServiceClass.GUARANTEED
        ]

    def _end_of(self, job: RunningJob) -> float:
        if job.expected_end is None:
            return self._now + self._default_end
        return job.expected_end

    def _all_held(self, located: bool = False) -> list[_Held]:
        """Every guaranteed job running, and those admitted so far in this cycle; `located`:
        with where each running one holds its GPUs (looked up only when a head is tied to some
        nodes: counted cluster-wide, it does not matter)."""
        if self._running_held is None:
            self._running_held = [
                _Held(
                    job.queue,
                    self._end_of(job),
                    job.gpus,
                    job.borrowed,
                    None,
                    job.key,
                )
                for job in self._running
                if job.service_class is ServiceClass.GUARANTEED
            ]
        if located and not self._located:
            for held in self._running_held:
                if held.owner is not None:
                    held.placed = self._placed(held.owner)
            self._located = True
        return self._running_held + self._admitted

    def _placed(self, owner: str) -> dict[str, int] | None:
        placed: dict[str, int] = {}
        for allocation in self.cluster.allocations_of(owner):
            if allocation.tenant.service_class is ServiceClass.GUARANTEED:
                gpus = len(allocation.gpu_indices)
                placed[allocation.node] = placed.get(allocation.node, 0) + gpus
        return placed or None
