"""One scheduling cycle on a cluster snapshot (Kueue-style, in numbered phases).

  1. usage: guaranteed and borrowed GPUs each queue holds now (quota, cohorts, fair share);
  2. lanes: pending jobs grouped and ordered by the queue policy;
  3. admission: repeatedly take the head of the next open lane (heads within their
     quota before heads that must borrow, then least-served), check quota (or borrow
     from the cohort, as Opportunistic), backfill reservations and the gang plan; an
     admitted plan is applied to the snapshot at once (assumed), so later jobs in the
     cycle see it;
  4. reclaim: a cohort whose lenders took their quota back is over-lent; borrowers
     are chosen for eviction (lowest priority, least progress, whole gangs) until
     what is borrowed fits what is lent;
  5. result: admitted jobs with their plans, every other job with its reason,
     the preemptions.

The operator runs it on a snapshot built from the API server; the simulator on
its live state. Same function, same decisions.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gangshare.core.cluster import Cluster
from gangshare.core.constraints import PodConstraints
from gangshare.core.gang import GangPlan, Unschedulable, apply_plan, never_fits, plan_gang
from gangshare.core.job import GangRequest, ServiceClass, Topology, TopologyPolicy
from gangshare.core.queueing import (
    QueuedJob,
    QueuePolicy,
    RunningJob,
    order_lanes,
    policy_refusal,
)
from gangshare.core.queues import CohortBook


@dataclass(frozen=True)
class Admission:
    job: QueuedJob
    plan: GangPlan
    # The class it runs as: Opportunistic when it runs on borrowed quota, whatever it asked.
    service_class: ServiceClass = ServiceClass.GUARANTEED
    borrowed: bool = False


@dataclass(frozen=True)
class Preemption:
    """A running borrower to evict whole and requeue, with why (for its events)."""

    job: RunningJob
    reason: str


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
    preemptions: list[Preemption] = field(default_factory=list)


ShapeKey = tuple[ServiceClass, int, Topology, str | None, int | None, PodConstraints]


def schedule_cycle(
    cluster: Cluster,
    pending: list[QueuedJob],
    running: list[RunningJob],
    policy: QueuePolicy,
    now: float,
) -> CycleResult:
    # Phase 1
    book = CohortBook(policy.queues)
    for holder in running:
        if holder.borrowed:
            book.borrowed[holder.queue] = book.borrowed.get(holder.queue, 0) + holder.gpus
        elif holder.service_class is ServiceClass.GUARANTEED:
            book.guaranteed[holder.queue] = book.guaranteed.get(holder.queue, 0) + holder.gpus
    # Phase 2
    lanes = order_lanes(policy, pending, book.guaranteed)
    # Phase 3
    cycle = _Cycle(cluster, running, policy, now, book)
    cohorts = any(spec.cohort for spec in policy.queues.values())
    pick_best = policy.fair_share or cohorts
    open_lanes = [lane for lane in lanes if lane]
    while open_lanes:
        lane = min(open_lanes, key=cycle.lane_priority) if pick_best else open_lanes[0]
        job = lane.pop(0)
        blocked = cycle.consider(job)
        if blocked and not (
            policy.backfill_of(job.queue) and job.service_class is ServiceClass.GUARANTEED
        ):
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
    if cohorts:
        cycle.reclaim()
    # Phase 5
    return cycle.result


def _holding_out(gang: GangRequest, waited: float) -> str:
    """What a Preferred scope that is still holding out adds to the reason it waits."""
    topology = gang.topology
    if topology.policy is not TopologyPolicy.PREFERRED or topology.relax_after_seconds is None:
        return ""
    if waited >= topology.relax_after_seconds:
        return ""
    left = topology.relax_after_seconds - waited
    return f" (waiting for topology {topology.scope.value}; a wider scope in {left:.0f}s)"


class _Cycle:
    def __init__(
        self,
        cluster: Cluster,
        running: list[RunningJob],
        policy: QueuePolicy,
        now: float,
        book: CohortBook,
    ) -> None:
        self.cluster = cluster
        self.running = running
        self.policy = policy
        self.now = now
        self.book = book
        self.usage = book.guaranteed
        self.result = CycleResult()
        # The cluster only fills up during a cycle, so a shape that failed keeps failing.
        self.failed_shapes: dict[ShapeKey, tuple[int, str]] = {}
        # Shape and workers -> why it can never fit (None: it could), judged once per cycle.
        self.never: dict[tuple[object, ...], str | None] = {}
        self._free_gpus: int | None = None
        # (expected end, GPUs) of every guaranteed job running or admitted in this cycle,
        # sorted: built once, then kept as admissions add to it (backfill reserves for every
        # blocked head, and rebuilding it each time made a large cycle quadratic).
        self._ending: list[tuple[float, int]] | None = None

    def lane_priority(self, lane: list[QueuedJob]) -> tuple[object, ...]:
        """Heads within their quota first (least served first under fair share); then heads
        that must borrow, always by weighted share of what they hold, aged by waiting so a
        light queue is never starved by heavy ones."""
        head = lane[0]
        if self._needs_borrowing(head):
            share = self.book.share(head.queue)
            share -= max(0.0, self.now - head.submitted_at) / self.policy.aging_seconds
            return (True, share, self.policy.order_key(head))
        share = 0.0
        if self.policy.fair_share:
            share = self.usage.get(head.queue, 0) / self.policy.weight(head.queue)
        return (False, share, self.policy.order_key(head))

    def _needs_borrowing(self, job: QueuedJob) -> bool:
        return (
            self._quota_reason(job) is not None
            and job.queue in self.policy.queues
            and (self.policy.queues[job.queue].cohort is not None)
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
            if not self._needs_borrowing(job):
                self.result.pending.append(Pending(job, quota, PendingKind.QUOTA))
                return True
            refusal = self.book.borrow_refusal(job.queue, job.gpus)
            if refusal is not None:
                self.result.pending.append(Pending(job, f"{quota}; {refusal}", PendingKind.QUOTA))
                return True
            # Beyond its quota it may still run, as Opportunistic on the cohort's idle quota.
            opportunistic = replace(job.gang, service_class=ServiceClass.OPPORTUNISTIC)
            return not self._place(job, opportunistic, borrowed=True)
        backfill = self._backfill_reason(job)
        if backfill is not None:
            self.result.pending.append(Pending(job, backfill, PendingKind.BACKFILL))
            return True
        return not self._place(job, job.gang, borrowed=False)

    def _place(self, job: QueuedJob, gang: GangRequest, borrowed: bool) -> bool:
        """Plan and assume the gang; False (with the reason recorded) when it does not fit."""
        waited = max(0.0, self.now - job.submitted_at)
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
            self._block(job, known[1] + _holding_out(gang, waited), borrowed)
            return False
        plan = plan_gang(self.cluster, gang, waited)
        if isinstance(plan, Unschedulable):
            # The shape's reason is shared; how long each job still holds out is its own.
            if known is None or gang.workers < known[0]:
                self.failed_shapes[shape] = (gang.workers, plan.reason)
            self._block(job, plan.reason + _holding_out(gang, waited), borrowed)
            return False
        apply_plan(self.cluster, gang, plan)
        if borrowed:
            self.book.borrowed[job.queue] = self.book.borrowed.get(job.queue, 0) + job.gpus
        elif gang.service_class is ServiceClass.GUARANTEED:
            self.usage[job.queue] = self.usage.get(job.queue, 0) + job.gpus
            if self._free_gpus is not None:
                self._free_gpus -= job.gpus
            if self._ending is not None:
                insort(self._ending, (self.now + self._estimate(job), job.gpus))
        self.result.admitted.append(Admission(job, plan, gang.service_class, borrowed))
        return True

    def reclaim(self) -> None:
        """Evict borrowers of every over-lent cohort: lowest priority, least progress first."""
        cohorts = {spec.cohort for spec in self.policy.queues.values() if spec.cohort}
        for cohort in sorted(cohorts):
            excess = self.book.over_lent(cohort)
            if excess <= 0:
                continue
            lent, held = self.book.lent(cohort), self.book.borrowed_in(cohort)
            members = {q.name for q in self.book.members(cohort)}
            # A borrower admitted earlier in this cycle may have counted on quota that a
            # guaranteed job behind it in its lane has since taken: undo such admissions first,
            # latest first (they lose no work), before evicting anything that runs.
            for admission in reversed(list(self.result.admitted)):
                if excess <= 0:
                    break
                if not admission.borrowed or admission.job.queue not in members:
                    continue
                excess -= admission.job.gpus
                self.book.borrowed[admission.job.queue] -= admission.job.gpus
                self.result.admitted.remove(admission)
                self.cluster.release(admission.plan.owner)
                reason = (
                    f"cohort {cohort} lends {lent} GPU(s) now, less than its borrowers need: "
                    "its lenders took their quota back in this cycle"
                )
                self.result.pending.append(Pending(admission.job, reason, PendingKind.QUOTA))
            borrowers = sorted(
                (j for j in self.running if j.borrowed and j.queue in members),
                key=lambda j: (j.priority, -j.started_at, -j.gpus, j.key),
            )
            for victim in borrowers:
                if excess <= 0:
                    break
                excess -= victim.gpus
                self.book.borrowed[victim.queue] -= victim.gpus
                reason = (
                    f"reclaimed: cohort {cohort}'s lenders took their quota back; it lends "
                    f"{lent} GPU(s) now and borrowers held {held}"
                )
                self.result.preemptions.append(Preemption(victim, reason))

    def _block(self, job: QueuedJob, reason: str, borrowed: bool = False) -> None:
        self.result.pending.append(Pending(job, reason))
        # A borrower runs on share slots, not on free GPUs: it has nothing to reserve.
        if (
            self.policy.backfill_of(job.queue)
            and job.service_class is ServiceClass.GUARANTEED
            and not borrowed
        ):
            self._reserve(job)

    def _quota_reason(self, job: QueuedJob) -> str | None:
        if job.service_class is not ServiceClass.GUARANTEED:
            return None
        quota = self.policy.quota(job.queue)
        used = self.usage.get(job.queue, 0)
        if quota is not None and used + job.gpus > quota:
            return (
                f"queue {job.queue} guaranteed quota: {used} of {quota} GPUs in use, "
                f"job needs {job.gpus}"
            )
        return None

    def _estimate(self, job: QueuedJob) -> float:
        return job.runtime_estimate or self.policy.default_runtime(job.queue)

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

    def _guaranteed_endings(self) -> list[tuple[float, int]]:
        if self._ending is None:
            ends = [
                (
                    job.expected_end
                    if job.expected_end is not None
                    else self.now + self.policy.default_runtime_seconds,
                    job.gpus,
                )
                for job in self.running
                if job.service_class is ServiceClass.GUARANTEED
            ]
            # Jobs admitted earlier in this cycle hold GPUs too, and free them by their estimate.
            ends += [
                (self.now + self._estimate(a.job), a.job.gpus)
                for a in self.result.admitted
                if a.service_class is ServiceClass.GUARANTEED
            ]
            self._ending = sorted(ends)
        return self._ending

    def _reserve(self, head: QueuedJob) -> None:
        """Earliest time enough GPUs free up for the head, by running jobs' expected ends."""
        free = self._free_guaranteed_gpus()
        start = self.now
        needed = head.gpus
        for end, gpus in self._guaranteed_endings():
            if free >= needed:
                break
            free += gpus
            start = max(start, end)
        if free < head.gpus:
            # Nothing that is running frees enough: a reservation would only stall everyone.
            return
        self.result.reservations.append(Reservation(head.key, start, max(0, free - head.gpus)))
