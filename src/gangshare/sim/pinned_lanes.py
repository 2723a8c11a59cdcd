"""The jobs of each lane grouped by the nodes they are pinned to and by kind, in lane order.

PendingIndex.candidates hands a cycle, of the jobs of a lane pinned to nodes with no GPU
free for guaranteed work, only the first of each kind (sim/full_nodes.py says why that
changes no decision). Finding them by visiting the whole lane at every cycle was itself
the cost once a backlog pinned to a rare GPU model grew to thousands (#39); kept grouped,
a cycle visits the jobs that may run, the first of each kind, and every job of nodes that
have GPUs free.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from gangshare.core.job import ServiceClass
from gangshare.core.queueing import QueuedJob
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


class _Lane:
    def __init__(self) -> None:
        self.anywhere: Ordered = ([], [])
        # nodes -> kind -> jobs
        self.pinned: dict[frozenset[str], dict[object, Ordered]] = {}


class PinnedLanes:
    """Guaranteed lanes' jobs, grouped as of `full.generation` (a node edit regroups them)."""

    def __init__(self, full: FullNodes, own_estimates: bool) -> None:
        self.full = full
        self.generation = full.generation
        # With predictions, a job's estimate is its queue's and GPU count's: no part of its kind.
        self._own_estimates = own_estimates
        self._lanes: dict[LaneKey, _Lane] = {}
        # job key -> where it was put: (nodes, kind), nodes None when it may run anywhere.
        self._put: dict[str, tuple[frozenset[str] | None, object]] = {}

    def fill(self, lanes: Iterable[tuple[LaneKey, list[SortKey], list[QueuedJob]]]) -> None:
        for lane, keys, jobs in lanes:
            for order, job in zip(keys, jobs, strict=True):
                self.add(lane, order, job)

    def add(self, lane: LaneKey, order: SortKey, job: QueuedJob) -> None:
        nodes, kind = self._where(job)
        self._put[job.key] = (nodes, kind)
        grouped = self._lanes.setdefault(lane, _Lane())
        if nodes is None:
            _insert(grouped.anywhere, order, job)
        else:
            _insert(grouped.pinned.setdefault(nodes, {}).setdefault(kind, ([], [])), order, job)

    def remove(self, lane: LaneKey, order: SortKey, key: str) -> None:
        nodes, kind = self._put.pop(key)
        grouped = self._lanes[lane]
        if nodes is None:
            _delete(grouped.anywhere, order)
            return
        kinds = grouped.pinned[nodes]
        _delete(kinds[kind], order)
        if not kinds[kind][0]:
            del kinds[kind]
            if not kinds:
                del grouped.pinned[nodes]

    def kept(self, lane: LaneKey, full: Callable[[frozenset[str]], bool]) -> Iterator[QueuedJob]:
        """The lane's jobs in order, but of those pinned to full nodes the first of each kind."""
        grouped = self._lanes[lane]
        streams: list[Iterable[tuple[SortKey, QueuedJob]]] = [_paired(grouped.anywhere)]
        for nodes, kinds in grouped.pinned.items():
            if full(nodes):
                firsts = sorted((keys[0], jobs[0]) for keys, jobs in kinds.values())
                streams.append(firsts)
            else:
                streams.extend(_paired(ordered) for ordered in kinds.values())
        for _, job in heapq.merge(*streams, key=lambda item: item[0]):
            yield job

    def _where(self, job: QueuedJob) -> tuple[frozenset[str] | None, object]:
        if job.service_class is not ServiceClass.GUARANTEED:
            return None, None
        nodes, shape = self.full.where(job.gang)
        estimate = job.runtime_estimate if self._own_estimates else None
        return nodes, (shape, job.gpus, job.priority, job.pod_priority, estimate)
