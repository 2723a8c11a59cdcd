"""The cluster snapshot: nodes, what is allocated to whom, and a best-fit index.

The operator builds one per scheduling cycle, the extender keeps one fed by
watches, the simulator keeps one as its live state. All mutation goes through
`allocate` and `release`, which keep the free-GPU index in step and count each node's
changes, so that a scheduling cycle can keep what it judged of a node (`verdicts_kept`)
until that node changes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from gangshare.core.gpu import Tenant
from gangshare.core.job import GangRequest, ServiceClass
from gangshare.core.node import NodeState

# A kept verdict (core/verdicts.py): the node's change count when judged, workers that fit,
# and one worker's score once asked for.
Verdict = tuple[int, int, float | None]
T = TypeVar("T")


class AllocationError(ValueError):
    """An allocation that would break an invariant (double guaranteed, over-capacity)."""


@dataclass(frozen=True)
class Allocation:
    node: str
    gpu_indices: tuple[int, ...]
    tenant: Tenant
    # Non-GPU requests the worker takes on the node (CPU, memory, pods), released with it.
    resources: tuple[tuple[str, int], ...] = field(default=())


# What kept_while_nodes_stand holds at most before starting afresh.
MAX_KEPT = 100_000


class Cluster:
    def __init__(self, nodes: Iterable[NodeState] = ()) -> None:
        self.nodes: dict[str, NodeState] = {}
        # free guaranteed GPU count -> node names (dicts as insertion-ordered sets, for determinism)
        self._by_free: dict[int, dict[str, None]] = {}
        self._allocations: dict[str, list[Allocation]] = {}
        # node name -> how often allocate/release changed it; verdicts kept while it stands
        self._changes: dict[str, int] = {}
        # Every change to any node (added, removed, allocated on, released from).
        self.version = 0
        # node name -> NodeState.shareable_spares, for nodes with any; refreshed when asked
        # for the nodes changed since (_unshared): a packed cluster refuses a borrower without
        # judging its every node (#39).
        self._shareable: dict[str, tuple[int, ...]] = {}
        self._unshared: set[str] = set()
        self._kept: dict[Hashable, Any] | None = None
        self._static: dict[Hashable, Any] = {}
        # What gangs keep of this cluster (kept_for) holds while this is the token.
        self._static_token = object()
        # Bumped whenever what kept_while_nodes_stand and kept_for hold is dropped.
        self.static_generation = 0
        # Within undone_after: how to undo each allocate and release, in order, and the
        # free-GPU index's buckets as they were before the block changed them (None: absent).
        self._undo: list[Callable[[], None]] | None = None
        self._buckets_before: dict[int, dict[str, None] | None] = {}
        for node in nodes:
            self.add_node(node)

    # ----- nodes -------------------------------------------------------------

    def add_node(self, node: NodeState) -> None:
        if node.name in self.nodes:
            raise ValueError(f"node {node.name} is already in the cluster")
        self.nodes[node.name] = node
        self._forget_static()
        node.recount()
        self._by_free.setdefault(node.free_guaranteed, {})[node.name] = None
        self._changed(node.name)

    def remove_node(self, name: str) -> NodeState:
        node = self.nodes.pop(name)
        self.version += 1
        self._unshared.add(name)
        self._forget_static()
        self._by_free[node.free_guaranteed].pop(name, None)
        for owner in list(self._allocations):
            kept = [a for a in self._allocations[owner] if a.node != name]
            if kept:
                self._allocations[owner] = kept
            else:
                del self._allocations[owner]
        return node

    def copy(self) -> Cluster:
        """An independent twin (nodes, GPUs and allocations copied) for a what-if replay
        (core/forecast.py) that must not change the snapshot it starts from."""
        twin = Cluster()
        twin.nodes = copy.deepcopy(self.nodes)
        twin._by_free = {free: dict(names) for free, names in self._by_free.items()}
        twin._allocations = {owner: list(held) for owner, held in self._allocations.items()}
        twin._changes = dict(self._changes)
        twin._shareable, twin._unshared = dict(self._shareable), set(self._unshared)
        twin.version = self.version
        return twin

    def __getstate__(self) -> dict[str, Any]:
        # What is kept for the living cluster (by object identity, or for one cycle) means
        # nothing to a twin in another process (the forecast worker's).
        return {
            **self.__dict__,
            "_kept": None,
            "_static": {},
            "_static_token": object(),
            "_undo": None,
            "_buckets_before": {},
        }

    @contextmanager
    def undone_after(self) -> Iterator[None]:
        """Every allocate and release within the block is undone at its end, latest first:
        the operator's cycle plans on the cluster it keeps current from watch events
        (kube/standing.py), whose allocations belong to the ledger alone; the admissions are
        held again from the jobs' statuses once written."""
        if self._undo is not None:
            raise RuntimeError("undone_after does not nest")
        self._undo = []
        self._buckets_before = {}
        try:
            yield
        finally:
            steps, self._undo = self._undo, None
            for step in reversed(steps):
                step()
            # Undone, each bucket of the free-GPU index holds the nodes it held, but in the
            # order they came back: ties between equally free nodes go as they went before.
            for free, names in self._buckets_before.items():
                if names is not None:
                    self._by_free[free] = names
                elif not self._by_free.get(free):
                    self._by_free.pop(free, None)
            self._buckets_before = {}

    def node(self, name: str) -> NodeState:
        return self.nodes[name]

    def racks(self) -> list[str]:
        return sorted({n.rack for n in self.nodes.values()})

    def nodes_with_free_at_least(self, count: int) -> Iterator[NodeState]:
        """Nodes with at least `count` GPUs free for guaranteed work, tightest first."""
        for free in sorted(k for k in self._by_free if k >= count):
            for name in self._by_free[free]:
                yield self.nodes[name]

    def open_to_opportunistic(self, gpus: int, memory_mib: int) -> Iterator[NodeState]:
        """Nodes with `gpus` GPUs an opportunistic worker asking `memory_mib` a GPU could share
        now, in no set order: the only nodes where one may fit (static checks aside)."""
        self._refresh_shareable()
        for name, spares in self._shareable.items():
            if len(spares) >= gpus and spares[gpus - 1] >= memory_mib:
                yield self.nodes[name]

    def may_share(self, name: str, gpus: int, memory_mib: int) -> bool:
        """Whether the node is among open_to_opportunistic(gpus, memory_mib)."""
        self._refresh_shareable()
        spares = self._shareable.get(name, ())
        return len(spares) >= gpus and spares[gpus - 1] >= memory_mib

    def _refresh_shareable(self) -> None:
        for name in self._unshared:
            node = self.nodes.get(name)
            spares = () if node is None else node.shareable_spares()
            if spares:
                self._shareable[name] = spares
            else:
                self._shareable.pop(name, None)
        self._unshared.clear()

    def count_with_free_at_least(self, count: int) -> int:
        return sum(len(names) for free, names in self._by_free.items() if free >= count)

    # ----- verdicts kept for one cycle ----------------------------------------

    @contextmanager
    def verdicts_kept(self) -> Iterator[None]:
        """Within the block, what a placement judged of a node for a worker request (room and
        score) is kept and reused until allocate or release changes that node. Only for a
        block that changes nodes no other way: a scheduling cycle (GPU utilization and node
        objects come in between cycles). Without it, a borrower's placement judged every node
        afresh: at 5,000 nodes and 10,000 queued jobs a new leader's first pass spent 137 s
        on that (bench/growth.py)."""
        self._kept = {}
        try:
            yield
        finally:
            self._kept = None

    def kept_verdicts(self, request: Hashable) -> dict[str, Verdict] | None:
        """The verdicts kept for this request, by node name; None outside `verdicts_kept`."""
        return self.kept_for_cycle(("verdicts", request), dict)

    def kept_for_cycle(self, key: Hashable, make: Callable[[], T]) -> T | None:
        """What the cycle keeps under `key` (made on first ask), for a keeper that checks
        `changes` or `version` itself; None outside `verdicts_kept`."""
        if self._kept is None:
            return None
        found = self._kept.get(key)
        if found is None:
            found = self._kept[key] = make()
        return cast(T, found)

    def kept_while_nodes_stand(self, key: Hashable, make: Callable[[], T]) -> T:
        """What depends only on what the nodes are (labels, taints, GPUs, schedulability), not
        on what runs there: made on first ask and kept, across cycles, until a node is added,
        removed or edited in place (whoever edits one says so: `nodes_edited`). A replay's
        cluster lives for thousands of cycles; each judged every node's filters afresh."""
        found = self._static.get(key)
        if found is None:
            found = self._static[key] = make()
        return cast(T, found)

    def kept_for(self, kind: str, gang: GangRequest, make: Callable[[], T]) -> T:
        """kept_while_nodes_stand for what depends on one gang alone, kept on the gang itself
        (GangRequest.kept) instead of hashing it: a replay visits every waiting gang at every
        cycle, and hashing each one's request was a third of a backlog pinned to a rare GPU
        model (#39). It goes with the gang, so no table of dead gangs grows."""
        found = gang.kept.get(kind)
        if found is None or found[0] is not self._static_token:
            found = gang.kept[kind] = (self._static_token, make())
        return cast(T, found[1])

    def _forget_static(self) -> None:
        self._static.clear()
        self._static_token = object()
        self.static_generation += 1

    def nodes_edited(self) -> None:
        """A node's labels, taints or schedulability changed in place."""
        self._forget_static()

    def touch(self, name: str) -> None:
        """The node's measured state (GPU utilization, memory in use) changed in place: what
        was judged of it is judged again, as after allocate or release."""
        self._changed(name)

    def free_guaranteed_total(self) -> int:
        return sum(free * len(names) for free, names in self._by_free.items())

    def changes(self, name: str) -> int:
        return self._changes.get(name, 0)

    def _changed(self, name: str) -> None:
        self.version += 1
        self._changes[name] = self._changes.get(name, 0) + 1
        self._unshared.add(name)

    # ----- allocations -------------------------------------------------------

    def allocate(
        self,
        owner: str,
        worker: str,
        node_name: str,
        gpu_indices: Sequence[int],
        service_class: ServiceClass,
        memory_mib: int | None = None,
        resources: Mapping[str, int] | None = None,
    ) -> Allocation:
        node = self.nodes[node_name]
        tenant = Tenant(owner, worker, service_class, memory_mib)
        indices = tuple(gpu_indices)
        if len(set(indices)) != len(indices):
            raise AllocationError(f"{worker}: GPU listed twice in {indices}")
        for index in indices:
            if not 0 <= index < node.gpu_count:
                raise AllocationError(f"{worker}: node {node_name} has no GPU {index}")
            gpu = node.gpus[index]
            if service_class is ServiceClass.GUARANTEED and gpu.guaranteed is not None:
                raise AllocationError(
                    f"{worker}: GPU {index} on {node_name} is held by {gpu.guaranteed.worker}"
                )
            if service_class is ServiceClass.OPPORTUNISTIC and gpu.free_share_slots() < 1:
                raise AllocationError(
                    f"{worker}: GPU {index} on {node_name} has no free share slot"
                )
        before = node.free_guaranteed
        self._attach(node, indices, tenant)
        taken = tuple(sorted((resources or {}).items()))
        _add_requests(node, taken, 1)
        self._reindex(node, before)
        allocation = Allocation(node_name, indices, tenant, taken)
        self._allocations.setdefault(owner, []).append(allocation)
        if self._undo is not None:
            self._undo.append(lambda: self._unallocate(owner, allocation))
        return allocation

    def release(self, owner: str) -> list[Allocation]:
        """Free everything `owner` holds (a whole gang, or one pod)."""
        released = self._allocations.pop(owner, [])
        self._detach_all(released)
        self._undo_later(owner, released)
        return released

    def release_worker(self, owner: str, worker: str) -> list[Allocation]:
        return self._release_where(owner, lambda a: a.tenant.worker == worker)

    def release_on_node(self, owner: str, node: str) -> list[Allocation]:
        """Free what `owner` holds on one node (a claim moved between nodes within one
        batch is held again on each node separately, in any order)."""
        return self._release_where(owner, lambda a: a.node == node)

    def _release_where(self, owner: str, chosen: Callable[[Allocation], bool]) -> list[Allocation]:
        kept: list[Allocation] = []
        released: list[Allocation] = []
        for allocation in self._allocations.get(owner, []):
            (released if chosen(allocation) else kept).append(allocation)
        if kept:
            self._allocations[owner] = kept
        else:
            self._allocations.pop(owner, None)
        self._detach_all(released)
        self._undo_later(owner, released)
        return released

    def allocations_of(self, owner: str) -> list[Allocation]:
        return list(self._allocations.get(owner, []))

    def owners(self) -> list[str]:
        return list(self._allocations)

    # ----- undoing -------------------------------------------------------------

    def _undo_later(self, owner: str, released: list[Allocation]) -> None:
        if self._undo is not None and released:
            self._undo.append(lambda: self._reattach(owner, released))

    def _unallocate(self, owner: str, allocation: Allocation) -> None:
        held = [a for a in self._allocations.get(owner, []) if a is not allocation]
        if held:
            self._allocations[owner] = held
        else:
            self._allocations.pop(owner, None)
        self._detach_all([allocation])

    def _reattach(self, owner: str, released: list[Allocation]) -> None:
        for allocation in released:
            node = self.nodes.get(allocation.node)
            if node is None:  # no cycle removes a node; nothing to give back to
                continue
            before = node.free_guaranteed
            self._attach(node, allocation.gpu_indices, allocation.tenant)
            _add_requests(node, allocation.resources, 1)
            self._reindex(node, before)
        self._allocations.setdefault(owner, []).extend(released)

    # ----- internals -----------------------------------------------------------

    @staticmethod
    def _attach(node: NodeState, indices: tuple[int, ...], tenant: Tenant) -> None:
        for index in indices:
            gpu = node.gpus[index]
            if tenant.service_class is ServiceClass.GUARANTEED:
                gpu.guaranteed = tenant
            else:
                gpu.opportunistic.append(tenant)

    @staticmethod
    def _detach(node: NodeState, allocation: Allocation) -> None:
        for index in allocation.gpu_indices:
            gpu = node.gpus[index]
            if gpu.guaranteed == allocation.tenant:
                gpu.guaranteed = None
            elif allocation.tenant in gpu.opportunistic:
                gpu.opportunistic.remove(allocation.tenant)

    def _detach_all(self, allocations: list[Allocation]) -> None:
        for allocation in allocations:
            node = self.nodes.get(allocation.node)
            if node is not None:
                before = node.free_guaranteed
                self._detach(node, allocation)
                _add_requests(node, allocation.resources, -1)
                self._reindex(node, before)

    def _reindex(self, node: NodeState, before: int) -> None:
        self._changed(node.name)
        node.recount()
        after = node.free_guaranteed
        if after != before:
            if self._undo is not None:
                for free in (before, after):
                    if free not in self._buckets_before:
                        bucket = self._by_free.get(free)
                        self._buckets_before[free] = None if bucket is None else dict(bucket)
            self._by_free[before].pop(node.name, None)
            self._by_free.setdefault(after, {})[node.name] = None


def _add_requests(node: NodeState, resources: tuple[tuple[str, int], ...], sign: int) -> None:
    for name, amount in resources:
        node.requested[name] = node.requested.get(name, 0) + sign * amount
