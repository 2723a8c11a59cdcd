"""Pending jobs kept in the core's lanes, already in the core's order, so a cycle need not see all.

The simulator keeps up to tens of thousands of jobs pending. `schedule_cycle`
sorts and visits every job it is given, so handing it all of them at every event
would cost O(pending) per event. The index keeps each lane (`QueuePolicy.lane_of`)
in `QueuePolicy.order_key` order and hands a cycle only the jobs whose outcome it
could change; `candidates` says why each left-out job cannot matter.

Run-time estimates are those of the moment, as the operator makes them each
pass: with `predict` given, every job handed out carries `predict(queue, GPUs)`.
Under Ordering.SHORTEST the order itself follows those predictions, so such a
lane is kept as one arrival-ordered list per GPU count (all of one count share a
prediction) and merged by the current estimate x GPUs when read.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from gangshare.core.job import ServiceClass
from gangshare.core.queueing import Ordering, QueuedJob, QueuePolicy
from gangshare.sim.full_nodes import FullNodes
from gangshare.sim.pinned_lanes import PinnedLanes

LaneKey = tuple[str, str, str]
SortKey = tuple[object, ...]
UNLIMITED = float("inf")
GUARANTEED = ServiceClass.GUARANTEED.value


def _keyed(first: object, jobs: list[QueuedJob]) -> Iterator[tuple[SortKey, QueuedJob]]:
    for job in jobs:
        yield (first, job.submitted_at, job.key), job


class PendingIndex:
    def __init__(
        self, policy: QueuePolicy, predict: Callable[[str, int], float] | None = None
    ) -> None:
        self.policy = policy
        self.predict = predict
        self._live_order = predict is not None and policy.ordering is Ordering.SHORTEST
        # lane -> part -> (sort keys, jobs); a part is the whole lane, or one GPU count.
        self._parts: dict[LaneKey, dict[int, tuple[list[SortKey], list[QueuedJob]]]] = {}
        self._where: dict[str, tuple[LaneKey, int, SortKey]] = {}
        self.opportunistic = 0
        # Predictions of the current read (they only change between cycles), and each
        # job as last handed out: rebuilt only when its estimate moved.
        self._estimates: dict[tuple[str, int], float] = {}
        self._handed: dict[str, QueuedJob] = {}
        # Guaranteed lanes grouped by pinned nodes (candidates' `on_full_nodes`): made by the
        # first cycle given them, then kept up to date.
        self._pinned: PinnedLanes | None = None

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def __iter__(self) -> Iterator[QueuedJob]:
        self._estimates.clear()
        for lane in self._parts:
            yield from self.lane(lane)

    def _sort_key(self, job: QueuedJob) -> tuple[int, SortKey]:
        if self._live_order:
            return job.gpus, (job.submitted_at, job.key)
        return 0, self.policy.order_key(job)

    def add(self, job: QueuedJob) -> None:
        if job.key in self._where:
            raise ValueError(f"{job.key} is already pending")
        lane = self.policy.lane_of(job)
        part, order = self._sort_key(job)
        keys, jobs = self._parts.setdefault(lane, {}).setdefault(part, ([], []))
        at = bisect_left(keys, order)
        keys.insert(at, order)
        jobs.insert(at, job)
        self._where[job.key] = (lane, part, order)
        self.opportunistic += job.service_class is ServiceClass.OPPORTUNISTIC
        if self._pinned is not None and lane[1] == GUARANTEED:
            self._pinned.add(lane, order, job)

    def remove(self, key: str) -> QueuedJob:
        lane, part, order = self._where.pop(key)
        if self._pinned is not None and lane[1] == GUARANTEED:
            self._pinned.remove(lane, order, key)
        parts = self._parts[lane]
        keys, jobs = parts[part]
        at = bisect_left(keys, order)
        del keys[at]
        job = jobs.pop(at)
        self._handed.pop(key, None)
        self.opportunistic -= job.service_class is ServiceClass.OPPORTUNISTIC
        if not jobs:
            del parts[part]
            if not parts:
                del self._parts[lane]
        return job

    def _fresh(self, job: QueuedJob) -> QueuedJob:
        if self.predict is None:
            return job
        shape = (job.queue, job.gpus)
        estimate = self._estimates.get(shape)
        if estimate is None:
            estimate = self._estimates[shape] = self.predict(*shape)
        handed = self._handed.get(job.key)
        if handed is None or handed.runtime_estimate != estimate:
            handed = self._handed[job.key] = replace(job, runtime_estimate=estimate)
        return handed

    def lane(self, lane: LaneKey) -> Iterator[QueuedJob]:
        """The lane's jobs in the core's order, with the estimates of the moment."""
        return map(self._fresh, self._in_order(lane))

    def _in_order(self, lane: LaneKey) -> Iterator[QueuedJob]:
        """The lane's jobs in the core's order, as queued: a reader that skips most of a long
        lane gives the estimates of the moment only to those it keeps."""
        parts = self._parts[lane]
        if not self._live_order:
            yield from parts[0][1]
            return
        streams = []
        for _, jobs in parts.values():
            # All jobs of one GPU count share the estimate, so order_key's first term too.
            first = self.policy.order_key(self._fresh(jobs[0]))[0]
            streams.append(_keyed(first, jobs))
        for _, job in heapq.merge(*streams, key=lambda item: item[0]):
            yield job

    def _grouped(self, full: FullNodes | None) -> PinnedLanes | None:
        """The guaranteed lanes grouped by pinned nodes, as of `full`'s nodes; None when not
        asked for, or under an order that moves with the estimates."""
        if full is None or self._live_order:
            return None
        kept = self._pinned
        if (
            kept is None
            or kept.full.cluster is not full.cluster
            or kept.generation != full.generation
        ):
            kept = self._pinned = PinnedLanes(full, own_estimates=self.predict is None)
            kept.fill(
                (lane, *parts[0]) for lane, parts in self._parts.items() if lane[1] == GUARANTEED
            )
        return kept

    def _strict(self, lane: LaneKey) -> bool:
        # The core clears a lane behind a blocked job, except guaranteed lanes under backfill.
        return not (self.policy.backfill and lane[1] == ServiceClass.GUARANTEED.value)

    def may_start(
        self,
        job: QueuedJob,
        free_gpus: int,
        headroom: Mapping[str, int],
        borrow_room: Mapping[str, int] | None = None,
        full: FullNodes | None = None,
    ) -> bool:
        """False when a just-arrived job certainly stays pending, the rest of the cluster unchanged.

        Called only when nothing was freed since the last cycle, so every other
        pending job is still blocked: a job behind them in a strict lane waits, and
        a guaranteed job needs its GPUs free and within its queue's quota, or (in a
        cohort) no more GPUs than its queue may still borrow.
        """
        self._estimates.clear()
        lane = self._where[job.key][0]
        if self._strict(lane) and next(self.lane(lane)).key != job.key:
            return False
        if job.service_class is ServiceClass.GUARANTEED:
            if job.gpus <= (borrow_room or {}).get(job.queue, 0):
                return True
            if full is not None and full.holds_back(job):
                return False
            return job.gpus <= free_gpus and job.gpus <= headroom.get(job.queue, UNLIMITED)
        return True

    def candidates(
        self,
        free_gpus: int,
        headroom: Mapping[str, int],
        share_slots: int,
        borrow_room: Mapping[str, int] | None = None,
        on_full_nodes: FullNodes | None = None,
    ) -> list[QueuedJob]:
        """The jobs a cycle must see to reach exactly the decisions it would reach on all of them.

        `borrow_room`: for each queue that may borrow (in a cohort, with a quota), the
        most GPUs it could borrow now; a borrowed job also takes a share slot per GPU.

        - Strict lane: jobs in order up to and including the first one that
          certainly blocks: with all earlier ones admitted, it would need more GPUs
          than are free for guaranteed work within its quota plus what its queue may
          borrow, or more share slots than are free. The core stops the lane there.
        - Guaranteed lane under backfill (the core visits all of it): the head, which
          sets the lane's place in the visiting order, and every job that fits its
          queue's remaining quota or what it may borrow. A job beyond both is refused
          before anything else is checked and changes nothing. Outside cohorts it
          cannot move the lane's order either, so leaving it out changes no decision.
          In a cohort it can: while it is the lane's head, the lane waits behind every
          head within its quota. Of each run of such jobs only the last matters (the
          ones before it are refused no later than it is), so it is kept. And the first
          job of the lane beyond both is kept: the first job a lane's quota blocks
          reserves that quota (core.cycle, EASY backfill), which refuses the jobs behind
          it that would not end before the reservation.
        - `on_full_nodes` (given only where no lanes compete: no fair share, no cohorts):
          the GPUs free for guaranteed work on the nodes a guaranteed job is pinned to, and
          a token of its shape there. Of the jobs of a lane without a quota that share a
          token, GPUs, priorities and estimate, the cycle admits no more than those GPUs
          hold, and every job behind one it refused is refused as it was and reserves
          nothing it did not (sim/full_nodes.py says why): only as many as the GPUs could
          hold, and one more, are kept. A backlog pinned to a rare GPU model was most of a
          cycle (#39); visiting all of it to find those firsts was next, so such lanes are
          kept grouped by pinned nodes and kind (sim/pinned_lanes.py), but under an order
          that moves with the estimates.
        """
        self._estimates.clear()
        rooms = borrow_room or {}
        chosen: list[QueuedJob] = []
        pinned = self._grouped(on_full_nodes)
        for lane in self._parts:
            guaranteed = lane[1] == ServiceClass.GUARANTEED.value
            room = headroom.get(lane[0], UNLIMITED) if guaranteed else UNLIMITED
            borrow = min(rooms.get(lane[0], 0), share_slots) if guaranteed else 0
            if not self._strict(lane) and pinned is not None and room == UNLIMITED:
                assert on_full_nodes is not None  # for mypy: pinned is made from it
                chosen.extend(map(self._fresh, pinned.kept(lane, on_full_nodes.free)))
                continue
            if not self._strict(lane):
                # Most of a backlogged lane is skipped: only the jobs kept get fresh estimates.
                queued = self._in_order(lane)
                kept = [next(queued)]
                in_cohort = lane[0] in rooms
                skipped: QueuedJob | None = None
                reserver_kept = False
                for job in queued:
                    if job.gpus <= room or job.gpus <= borrow:
                        if skipped is not None:
                            kept.append(skipped)
                            skipped = None
                        kept.append(job)
                    elif not reserver_kept:
                        kept.append(job)
                        reserver_kept = True
                    elif in_cohort:
                        skipped = job
                chosen.extend(map(self._fresh, kept))
                continue
            bound = min(free_gpus, room) + borrow if guaranteed else share_slots
            used = 0
            for job in self.lane(lane):
                chosen.append(job)
                used += job.gpus
                if used > bound:
                    break
        return chosen
