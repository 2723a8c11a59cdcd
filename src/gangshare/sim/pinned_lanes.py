"""The jobs of each lane grouped by the nodes they are pinned to and by kind, in lane order.

PendingIndex.candidates hands a cycle, of the jobs alike pinned to some nodes, only as many
as those nodes have room for, and one more (sim/full_nodes.py says why that changes no
decision). Finding them by visiting the whole lane at every cycle was itself the cost once a
backlog pinned to a rare GPU model grew to thousands (#39); kept grouped, a cycle visits the
jobs that may run anywhere, and of each kind pinned to some nodes the first few.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from gangshare.core.job import ServiceClass
from gangshare.core.queueing import PodPriority, QueuedJob
from gangshare.sim.full_nodes import FullNodes

LaneKey = tuple[str, str, str]
SortKey = tuple[object, ...]
# Jobs in lane order: their sort keys, and the jobs.
Ordered = tuple[list[SortKey], list[QueuedJob]]


def _insert(ordered: Ordered, order: SortKey, job: QueuedJob) -> None:
    keys, jobs = ordered
    at = bisect_left(keys, order)
    keys.insert(at, order)
    jobs.insert(at, job)


def _delete(ordered: Ordered, order: SortKey) -> None:
    keys, jobs = ordered
    at = bisect_left(keys, order)
    del keys[at]
    del jobs[at]


def _paired(ordered: Ordered) -> Iterable[tuple[SortKey, QueuedJob]]:
    return zip(*ordered, strict=True)


@dataclass(frozen=True)
class _Kind:
    """All of a pinned job that a cycle's judgement of it reads, but its name and how long it
    waited (so jobs alike stand in a lane in the order they came, and a topology that loosens
    with waiting is never looser for a later one)."""

    shape: object
    gpus: int
    priority: int
    pod_priority: PodPriority | None
    estimate: float | None


class _Lane:
    def __init__(self) -> None:
        self.anywhere: Ordered = ([], [])
        # nodes -> kind -> jobs
        self.pinned: dict[frozenset[str], dict[_Kind, Ordered]] = {}


class PinnedLanes:
    """Guaranteed lanes' jobs, grouped as of `full.generation` (a node edit regroups them)."""

    def __init__(self, full: FullNodes, own_estimates: bool) -> None:
        self.full = full
        self.generation = full.generation
        # With predictions, a job's estimate is its queue's and GPU count's: no part of its kind.
        self._own_estimates = own_estimates
        self._lanes: dict[LaneKey, _Lane] = {}
        # job key -> where it was put: (nodes, kind), None when it may run anywhere.
        self._put: dict[str, tuple[frozenset[str], _Kind] | None] = {}

    def fill(self, lanes: Iterable[tuple[LaneKey, list[SortKey], list[QueuedJob]]]) -> None:
        for lane, keys, jobs in lanes:
            for order, job in zip(keys, jobs, strict=True):
                self.add(lane, order, job)

    def add(self, lane: LaneKey, order: SortKey, job: QueuedJob) -> None:
        where = self._put[job.key] = self._where(job)
        grouped = self._lanes.setdefault(lane, _Lane())
        if where is None:
            _insert(grouped.anywhere, order, job)
        else:
            nodes, kind = where
            _insert(grouped.pinned.setdefault(nodes, {}).setdefault(kind, ([], [])), order, job)

    def remove(self, lane: LaneKey, order: SortKey, key: str) -> None:
        where = self._put.pop(key)
        grouped = self._lanes[lane]
        if where is None:
            _delete(grouped.anywhere, order)
            return
        nodes, kind = where
        kinds = grouped.pinned[nodes]
        _delete(kinds[kind], order)
        if not kinds[kind][0]:
            del kinds[kind]
            if not kinds:
                del grouped.pinned[nodes]

    def kept(self, lane: LaneKey, free: Callable[[frozenset[str]], int]) -> Iterator[QueuedJob]:
        """The lane's jobs in order, but of the jobs alike pinned to some nodes only as many as
        the GPUs free there for guaranteed work (`free`) could hold, and one more."""
        grouped = self._lanes[lane]
        streams: list[Iterable[tuple[SortKey, QueuedJob]]] = [_paired(grouped.anywhere)]
        for nodes, kinds in grouped.pinned.items():
            room = free(nodes)
            for kind, ordered in kinds.items():
                streams.append(islice(_paired(ordered), room // kind.gpus + 1))
        for _, job in heapq.merge(*streams, key=lambda item: item[0]):
            yield job

    def _where(self, job: QueuedJob) -> tuple[frozenset[str], _Kind] | None:
        """The nodes a guaranteed job is pinned to, and its kind there; None when it may run
        anywhere (or is not guaranteed)."""
        if job.service_class is not ServiceClass.GUARANTEED:
            return None
        nodes, shape = self.full.where(job.gang)
        if nodes is None:
            return None
        estimate = job.runtime_estimate if self._own_estimates else None
        return nodes, _Kind(shape, job.gpus, job.priority, job.pod_priority, estimate)
