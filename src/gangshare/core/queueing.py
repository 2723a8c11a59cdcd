"""Queue policy: which pending job is considered next, and in which lane it waits.

Jobs wait in lanes. A lane is (queue, service class, size class): inside a lane
the order is strict, so a blocked head blocks the lane (unless backfill lets
short jobs past it); lanes do not block each other. This is how separating
small (<= 2 GPUs) from large jobs stops large heads from stalling small jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gangshare.core.job import GangRequest, ServiceClass


class Ordering(StrEnum):
    FIFO = "FIFO"
    # Higher spec.priority first, FIFO among equals.
    PRIORITY = "Priority"
    # Least estimated GPU-time first (QSSF with predicted run times, SJF with exact ones).
    SHORTEST = "ShortestFirst"


@dataclass(frozen=True)
class QueuedJob:
    key: str
    gang: GangRequest
    submitted_at: float
    queue: str = "default"
    priority: int = 0
    # Seconds the job is expected to run; None when nothing predicts it.
    runtime_estimate: float | None = None

    @property
    def service_class(self) -> ServiceClass:
        return self.gang.service_class

    @property
    def gpus(self) -> int:
        return self.gang.total_gpus


@dataclass(frozen=True)
class RunningJob:
    key: str
    queue: str
    gpus: int
    service_class: ServiceClass
    # When it is expected to finish (absolute time); None when unknown.
    expected_end: float | None = None


@dataclass(frozen=True)
class QueuePolicy:
    ordering: Ordering = Ordering.FIFO
    # Multi-queue: jobs with at most this many GPUs wait in their own lane.
    small_job_max_gpus: int | None = None
    # Visit lanes by queue usage / weight (least served first) instead of by head age.
    fair_share: bool = False
    # EASY backfill: a blocked head reserves the GPUs it waits for; later jobs may start
    # only if they end (by estimate) before that reservation or fit beside it.
    backfill: bool = False
    # Guaranteed GPU quota per queue; queues not listed are unlimited.
    quotas: Mapping[str, int] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)
    # Highest spec.priority a queue accepts ("*" for queues not listed); unlisted: unbounded.
    max_priority: Mapping[str, int] = field(default_factory=dict)
    # Used by backfill for jobs nothing predicts.
    default_runtime_seconds: float = 3600.0

    def lane_of(self, job: QueuedJob) -> tuple[str, str, str]:
        size = "all"
        if self.small_job_max_gpus is not None:
            size = "small" if job.gpus <= self.small_job_max_gpus else "large"
        return (job.queue, job.service_class.value, size)

    def order_key(self, job: QueuedJob) -> tuple[float, float, str]:
        if self.ordering is Ordering.PRIORITY:
            return (-job.priority, job.submitted_at, job.key)
        if self.ordering is Ordering.SHORTEST:
            runtime = job.runtime_estimate or self.default_runtime_seconds
            return (runtime * job.gpus, job.submitted_at, job.key)
        return (job.submitted_at, 0.0, job.key)

    def priority_limit(self, queue: str) -> int | None:
        return self.max_priority.get(queue, self.max_priority.get("*"))

    def weight(self, queue: str) -> float:
        return max(1e-9, self.weights.get(queue, 1.0))


def policy_refusal(policy: QueuePolicy, job: QueuedJob) -> str | None:
    """What the queue's policy never allows this job, whatever else runs; None when allowed."""
    limit = policy.priority_limit(job.queue)
    if limit is not None and job.priority > limit:
        return f"spec.priority {job.priority} is above queue {job.queue}'s maximum of {limit}"
    quota = policy.quotas.get(job.queue)
    if job.service_class is ServiceClass.GUARANTEED and quota is not None and job.gpus > quota:
        return (
            f"needs {job.gpus} guaranteed GPUs, more than queue {job.queue}'s "
            f"whole quota of {quota}"
        )
    return None


def order_lanes(
    policy: QueuePolicy, pending: list[QueuedJob], usage: Mapping[str, int]
) -> list[list[QueuedJob]]:
    """Pending jobs grouped into lanes, each lane ordered, lanes in visiting order."""
    lanes: dict[tuple[str, str, str], list[QueuedJob]] = {}
    for job in pending:
        lanes.setdefault(policy.lane_of(job), []).append(job)
    for jobs in lanes.values():
        jobs.sort(key=policy.order_key)

    def lane_key(item: tuple[tuple[str, str, str], list[QueuedJob]]) -> tuple[object, ...]:
        (queue, _, _), jobs = item
        head = policy.order_key(jobs[0])
        if policy.fair_share:
            return (usage.get(queue, 0) / policy.weight(queue), head)
        return (head,)

    return [jobs for _, jobs in sorted(lanes.items(), key=lane_key)]
