"""A cycle's backfill reservations: what its blocked heads are promised, and who may start.

A guaranteed head blocked by GPUs, or by its queue's quota, reserves what it waits for from
the earliest time running jobs' expected ends free it (core/backfill.py says the rules). The
cycle (core/cycle.py) asks this book three things: may a job start beside the reservations,
reserve for a head that stays blocked, and count a job it admitted against them.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangshare.core.backfill import (
    BackfillRefusal,
    Reservation,
    backfill_refusal,
    dominated,
    free_at,
    gpus_free_from,
    hold_all,
    quota_free_from,
    used_at,
)
from gangshare.core.cluster import Cluster
from gangshare.core.held import HeldGpus, Nodes, nodes_for
from gangshare.core.job import ServiceClass
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob


def estimate(policy: QueuePolicy, job: QueuedJob) -> float:
    """How long the job is expected to run (its own estimate, else its queue's default)."""
    return job.runtime_estimate or policy.default_runtime(job.queue)


class ReservationBook:
    def __init__(
        self,
        cluster: Cluster,
        running: list[RunningJob],
        policy: QueuePolicy,
        now: float,
        usage: Mapping[str, int],
        reservations: list[Reservation],
    ) -> None:
        self.policy = policy
        self.now = now
        # Guaranteed GPUs each queue holds, as the cycle's admissions move it.
        self.usage = usage
        self.reservations = reservations
        # Guaranteed GPUs free and freeing, where blocked heads can run.
        self.held = HeldGpus(cluster, running, now, policy.default_runtime_seconds)
        # Lanes whose first quota-blocked job reserved in this cycle.
        self._quota_lanes: set[tuple[str, str, str]] = set()
        # (nodes, GPUs) -> HeldGpus.version when a head of that size last asked for a GPU
        # reservation there: until the next admission, another such head would get the same
        # start and spare, which the first one's (or one dominating it) already covers.
        self._gpu_reserved: dict[tuple[Nodes, int], int] = {}

    def refusal(self, job: QueuedJob) -> BackfillRefusal | None:
        """Why a guaranteed job may not start now beside the reservations; None when it may."""
        if not self.reservations or job.service_class is not ServiceClass.GUARANTEED:
            return None
        ends = self.now + estimate(self.policy, job)
        return backfill_refusal(self.reservations, job.queue, job.gpus, ends)

    def assumed(self, job: QueuedJob, placed: Mapping[str, int], borrowed: bool) -> None:
        """Count a guaranteed job the cycle admitted: its GPUs are held until its expected end,
        and, unless borrowed, against what every reservation leaves to spare."""
        ends = self.now + estimate(self.policy, job)
        self.held.assumed(job.queue, placed, ends, borrowed)
        if not borrowed:
            hold_all(self.reservations, job.queue, placed, ends)

    def reserve_quota_once_per_lane(self, head: QueuedJob) -> None:
        """Only the first job of a lane its quota blocks reserves (EASY backfill): the jobs
        behind it reserve in their turn, and reserving for all made a backlog quadratic."""
        lane = self.policy.lane_of(head)
        if lane not in self._quota_lanes:
            self._quota_lanes.add(lane)
            self.reserve(head, quota_blocked=True)

    def reserve(self, head: QueuedJob, quota_blocked: bool = False) -> None:
        """Reserve for a blocked head what it waits for, from the earliest time running jobs'
        expected ends free it: GPUs, and its queue's quota when that is what blocks it."""
        # Only GPUs on nodes it can run on: others neither bring its start nearer nor are
        # kept from jobs that can use them.
        nodes = nodes_for(self.held.cluster, head.gang)
        if not quota_blocked:
            asked = (nodes, head.gpus)
            if self._gpu_reserved.get(asked) == self.held.version:
                return
            self._gpu_reserved[asked] = self.held.version
        free, endings = self.held.free(nodes), self.held.endings(nodes)
        start = gpus_free_from(free, endings, head.gpus, self.now)
        if start is None:
            # Nothing that is running frees enough: a reservation would only stall everyone.
            return
        reservation = Reservation(head.key, start, 0, head.gpus, nodes=nodes)
        quota = self.policy.quota(head.queue)
        if quota_blocked and quota is not None:
            if not self._reserve_quota(head, quota, reservation):
                return
        elif quota_blocked:
            return
        reservation.extra = max(0, free_at(free, endings, reservation.start) - head.gpus)
        reservation.until = reservation.start + estimate(self.policy, head)
        if reservation.queue is None and dominated(self.reservations, reservation):
            return
        self.reservations.append(reservation)

    def _reserve_quota(self, head: QueuedJob, quota: int, reservation: Reservation) -> bool:
        """Add the head's queue's quota to its reservation; False when its own queue's running
        jobs never leave it enough."""
        # Heads of the queue that reserved before it are served first: counted as if they
        # held their GPUs from now until they are expected to end.
        ahead = [r for r in self.reservations if r.queue == head.queue]
        used = self.usage.get(head.queue, 0) + sum(r.gpus for r in ahead)
        mine = self.held.queue_endings(head.queue)
        if ahead:
            mine = sorted([*mine, *((r.until, r.gpus) for r in ahead)])
        quota_start = quota_free_from(used, quota, mine, head.gpus, self.now)
        if quota_start is None:
            return False
        reservation.start = max(reservation.start, quota_start)
        reservation.queue = head.queue
        if self._starving(head):
            # Waited past the bound: no other job of its queue starts guaranteed before it.
            reservation.quota_start, reservation.quota_extra = self.now, 0
        else:
            left = quota - used_at(used, mine, quota_start) - head.gpus
            reservation.quota_start, reservation.quota_extra = quota_start, max(0, left)
        return True

    def _starving(self, job: QueuedJob) -> bool:
        bound = self.policy.starvation_seconds
        return bound is not None and self.now - job.submitted_at >= bound
