"""What one scheduling cycle decides: admissions with their plans, why every other job waits,
and which borrowers to evict."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gangshare.core.backfill import Reservation
from gangshare.core.gang import GangPlan
from gangshare.core.job import GangRequest, ServiceClass, TopologyPolicy
from gangshare.core.queueing import QueuedJob, RunningJob


@dataclass(frozen=True)
class Admission:
    job: QueuedJob
    plan: GangPlan
    # The class it runs as: Opportunistic when it runs on borrowed quota, whatever it asked.
    service_class: ServiceClass = ServiceClass.GUARANTEED
    borrowed: bool = False

    def running(self, started_at: float, expected_end: float, evictions: int = 0) -> RunningJob:
        """The admitted job as a running one, in the class it was admitted as."""
        job = self.job
        return RunningJob(
            job.key,
            job.queue,
            job.gpus,
            self.service_class,
            expected_end,
            borrowed=self.borrowed,
            priority=job.priority,
            started_at=started_at,
            evictions=evictions,
        )


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
class CycleResult:
    admitted: list[Admission] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)


def holding_out(gang: GangRequest, waited: float) -> str:
    """What a Preferred scope that is still holding out adds to the reason it waits."""
    topology = gang.topology
    if topology.policy is not TopologyPolicy.PREFERRED or topology.relax_after_seconds is None:
        return ""
    if waited >= topology.relax_after_seconds:
        return ""
    left = topology.relax_after_seconds - waited
    return f" (waiting for topology {topology.scope.value}; a wider scope in {left:.0f}s)"
