"""One scheduling cycle on a cluster snapshot (Kueue-style, in numbered phases).

  1. usage: guaranteed GPUs each queue holds now (quota, fair share);
  2. lanes: pending jobs grouped and ordered by the queue policy;
  3. admission: repeatedly take the head of the least-served open lane, check
     quota, backfill reservations and the gang plan; an admitted plan is applied
     to the snapshot at once (assumed), so later jobs in the cycle see it;
  4. result: admitted jobs with their plans, every other job with its reason.

The operator runs it on a snapshot built from the API server; the simulator on
its live state. Same function, same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gangshare.core.cluster import Cluster
from gangshare.core.constraints import PodConstraints
from gangshare.core.gang import GangPlan, Unschedulable, apply_plan, never_fits, plan_gang
from gangshare.core.job import ServiceClass, Topology
from gangshare.core.queueing import (
    QueuedJob,
    QueuePolicy,
    RunningJob,
    order_lanes,
    policy_refusal,
)


@dataclass(frozen=True)
class Admission:
    job: QueuedJob
    plan: GangPlan


class PendingKind(StrEnum):
    """Why a job still waits, as a CamelCase reason for conditions and events."""

    UNSCHEDULABLE = "Unschedulable"
    QUOTA = "QuotaExceeded"
    BEHIND = "WaitingInQueue"
    BACKFILL = "WaitingForReservation"
    # Waiting cannot help (the shape fits nowhere, above the queue's quota or priority bound):
    # the job is marked and skipped, so it never blocks the jobs behind it.
    INADMISSIBLE = "Inadmissible"


@dataclass(frozen=True)
class Pending:
    job: QueuedJob
    reason: str
    kind: PendingKind = PendingKind.UNSCHEDULABLE


@dataclass
class Reservation:
    """A blocked head's claim (EASY backfill): GPUs expected free at `start`, `extra` to spare."""

    head: str
    start: float
    extra: int


@dataclass
class CycleResult:
    admitted: list[Admission] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)


ShapeKey = tuple[ServiceClass, int, Topology, str | None, int | None, PodConstraints]


def schedule_cycle(
    cluster: Cluster,
    pending: list[QueuedJob],
    running: list[RunningJob],
    policy: QueuePolicy,
    now: float,
) -> CycleResult:
    # Phase 1
    usage: dict[str, int] = {}
    for holder in running:
        if holder.service_class is ServiceClass.GUARANTEED:
            usage[holder.queue] = usage.get(holder.queue, 0) + holder.gpus
    # Phase 2
    lanes = order_lanes(policy, pending, usage)
    # Phase 3
    cycle = _Cycle(cluster, running, policy, now, usage)
    open_lanes = [lane for lane in lanes if lane]
    while open_lanes:
        lane = min(open_lanes, key=cycle.lane_priority) if policy.fair_share else open_lanes[0]
        job = lane.pop(0)
        blocked = cycle.consider(job)
        if blocked and not (policy.backfill and job.service_class is ServiceClass.GUARANTEED):
            for waiting in lane:
                if not cycle.mark_if_inadmissible(waiting):
                    cycle.result.pending.append(
                        Pending(
                            waiting,
                            f"waiting behind {job.key} (strict order in its queue)",
                            PendingKind.BEHIND,
                        )
                    )
            lane.clear()
        if not lane:
            open_lanes.remove(lane)
    # Phase 4
    return cycle.result


class _Cycle:
    def __init__(
        self,
        cluster: Cluster,
        running: list[RunningJob],
        policy: QueuePolicy,
        now: float,
        usage: dict[str, int],
    ) -> None:
        self.cluster = cluster
        self.running = running
        self.policy = policy
        self.now = now
        self.usage = usage
        self.result = CycleResult()
        # The cluster only fills up during a cycle, so a shape that failed keeps failing.
        self.failed_shapes: dict[ShapeKey, tuple[int, str]] = {}
        # Shape and workers -> why it can never fit (None: it could), judged once per cycle.
        self.never: dict[tuple[object, ...], str | None] = {}
        self._free_gpus: int | None = None

    def lane_priority(self, lane: list[QueuedJob]) -> tuple[float, tuple[float, float, str]]:
        head = lane[0]
        return (
            self.usage.get(head.queue, 0) / self.policy.weight(head.queue),
            self.policy.order_key(head),
        )

    def mark_if_inadmissible(self, job: QueuedJob) -> bool:
        """Record the job as Inadmissible when waiting cannot help it; True if so."""
        gang = job.gang
        key: tuple[object, ...] = (
            gang.service_class,
            gang.workers,
            gang.gpus_per_worker,
            gang.topology,
            gang.gpu_model,
            gang.gpu_memory_mib,
            gang.constraints,
        )
        if key not in self.never:
            self.never[key] = never_fits(self.cluster, gang)
        reason = policy_refusal(self.policy, job) or self.never[key]
        if reason is None:
            return False
        self.result.pending.append(Pending(job, reason, PendingKind.INADMISSIBLE))
        return True

    def consider(self, job: QueuedJob) -> bool:
        """Admit the job if it may run now; True when it stays blocked (and blocks its lane)."""
        if self.mark_if_inadmissible(job):
            return False
        quota = self._quota_reason(job)
        if quota is not None:
            self.result.pending.append(Pending(job, quota, PendingKind.QUOTA))
            return True
        backfill = self._backfill_reason(job)
        if backfill is not None:
            self.result.pending.append(Pending(job, backfill, PendingKind.BACKFILL))
            return True
        waited = max(0.0, self.now - job.submitted_at)
        gang = job.gang
        shape: ShapeKey = (
            gang.service_class,
            gang.gpus_per_worker,
            gang.topology.effective(waited),
            gang.gpu_model,
            gang.gpu_memory_mib,
            gang.constraints,
        )
        known = self.failed_shapes.get(shape)
        if known is not None and gang.workers >= known[0]:
            self._block(job, known[1])
            return True
        plan = plan_gang(self.cluster, gang, waited)
        if isinstance(plan, Unschedulable):
            if known is None or gang.workers < known[0]:
                self.failed_shapes[shape] = (gang.workers, plan.reason)
            self._block(job, plan.reason)
            return True
        apply_plan(self.cluster, gang, plan)
        if job.service_class is ServiceClass.GUARANTEED:
            self.usage[job.queue] = self.usage.get(job.queue, 0) + job.gpus
            if self._free_gpus is not None:
                self._free_gpus -= job.gpus
        self.result.admitted.append(Admission(job, plan))
        return False

    def _block(self, job: QueuedJob, reason: str) -> None:
        self.result.pending.append(Pending(job, reason))
        if self.policy.backfill and job.service_class is ServiceClass.GUARANTEED:
            self._reserve(job)

    def _quota_reason(self, job: QueuedJob) -> str | None:
        if job.service_class is not ServiceClass.GUARANTEED:
            return None
        quota = self.policy.quotas.get(job.queue)
        used = self.usage.get(job.queue, 0)
        if quota is not None and used + job.gpus > quota:
            return (
                f"queue {job.queue} guaranteed quota: {used} of {quota} GPUs in use, "
                f"job needs {job.gpus}"
            )
        return None

    def _estimate(self, job: QueuedJob) -> float:
        return job.runtime_estimate or self.policy.default_runtime_seconds

    def _backfill_reason(self, job: QueuedJob) -> str | None:
        if not self.result.reservations or job.service_class is not ServiceClass.GUARANTEED:
            return None
        ends = self.now + self._estimate(job)
        for reservation in self.result.reservations:
            if ends > reservation.start and job.gpus > reservation.extra:
                return (
                    f"backfill: would delay {reservation.head}, which holds a reservation "
                    f"from t={reservation.start:.0f}s"
                )
        for reservation in self.result.reservations:
            if ends > reservation.start:
                reservation.extra -= job.gpus
        return None

    def _free_guaranteed_gpus(self) -> int:
        if self._free_gpus is None:
            self._free_gpus = sum(node.free_guaranteed for node in self.cluster.nodes.values())
        return self._free_gpus

    def _reserve(self, head: QueuedJob) -> None:
        """Earliest time enough GPUs free up for the head, by running jobs' expected ends."""
        free = self._free_guaranteed_gpus()
        start = self.now
        ending = sorted(
            (
                job.expected_end
                if job.expected_end is not None
                else self.now + self.policy.default_runtime_seconds,
                job.gpus,
            )
            for job in self.running
            if job.service_class is ServiceClass.GUARANTEED
        )
        for end, gpus in ending:
            if free >= head.gpus:
                break
            free += gpus
            start = max(start, end)
        if free < head.gpus:
            # Nothing that is running frees enough: a reservation would only stall everyone.
            return
        self.result.reservations.append(Reservation(head.key, start, max(0, free - head.gpus)))
