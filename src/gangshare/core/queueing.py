"""Queue policy: which pending job is considered next, and in which lane it waits.

Jobs wait in lanes. A lane is (queue, service class, size class): inside a lane
the order is strict, so a blocked head blocks the lane (unless backfill lets
short jobs past it); lanes do not block each other. This is how separating
small (<= 2 GPUs) from large jobs stops large heads from stalling small jobs.
Per-queue settings (quota, cohort, accepted sizes, ordering, backfill) come from
`QueueSpec`s (queues.py); the flat `quotas`/`weights`/`max_priority` maps remain
for callers that have no Queue objects (the simulator's cluster specs, flags).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from gangshare.core.job import GangRequest, ServiceClass
from gangshare.core.queues import Ordering, QueueSpec, most_borrowable

__all__ = [
    "Ordering",
    "PodPriority",
    "QueuePolicy",
    "QueuedJob",
    "RunningJob",
    "order_lanes",
    "policy_refusal",
]


@dataclass(frozen=True)
class PodPriority:
    """The PriorityClass a job's pod template names, and its value (None: no such class)."""

    class_name: str
    value: int | None


@dataclass(frozen=True)
class QueuedJob:
    key: str
    gang: GangRequest
    submitted_at: float
    queue: str = "default"
    priority: int = 0
    # Seconds the job is expected to run; None when nothing predicts it.
    runtime_estimate: float | None = None
    # What its workers' priorityClassName makes them worth to kube-scheduler and the kubelet.
    pod_priority: PodPriority | None = None

    @property
    def service_class(self) -> ServiceClass:
        return self.gang.service_class

    @cached_property
    def gpus(self) -> int:
        # Read for every job at every step of a cycle (quota, backfill, reservations).
        return self.gang.total_gpus


@dataclass(frozen=True)
class RunningJob:
    key: str
    queue: str
    gpus: int
    service_class: ServiceClass
    # When it is expected to finish (absolute time); None when unknown.
    expected_end: float | None = None
    # Runs on its cohort's idle quota (beyond its queue's nominal quota): reclaimable.
    borrowed: bool = False
    priority: int = 0
    # When it started (or was admitted): the latest started has the least progress to lose.
    started_at: float = 0.0
    # Times it was evicted before (reclaims and memory evictions): bounded by the policy.
    evictions: int = 0


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
    # Queue objects by name; what they set overrides the flat maps above.
    queues: Mapping[str, QueueSpec] = field(default_factory=dict)
    # A job naming a queue that is not in `queues` is Inadmissible (the operator's rule).
    require_known_queue: bool = False
    # Borrowing heads gain one unit of share for every this many seconds they wait, so a
    # queue with a small weight is never starved by heavier ones.
    aging_seconds: float = 3600.0
    # A head blocked by its queue's quota this long gets the quota outright: no other job of
    # its queue starts guaranteed before it (None: backfill's reservation alone bounds it).
    starvation_seconds: float | None = None
    # A borrower runs at least this long before reclaim may evict it (KAI-Scheduler's
    # minimum runtime): an eviction right after a start loses the start's whole cost.
    reclaim_min_runtime_seconds: float = 0.0
    # A borrower evicted this many times is not reclaimed again; it runs to its end.
    max_evictions_per_job: int | None = None

    def __post_init__(self) -> None:
        if not self.aging_seconds > 0:
            raise ValueError(f"aging_seconds: must be positive, got {self.aging_seconds}")
        if self.reclaim_min_runtime_seconds < 0:
            raise ValueError(
                "reclaim_min_runtime_seconds: must not be negative, got "
                f"{self.reclaim_min_runtime_seconds}"
            )
        if self.max_evictions_per_job is not None and self.max_evictions_per_job < 0:
            raise ValueError(
                f"max_evictions_per_job: must not be negative, got {self.max_evictions_per_job}"
            )

    def reclaimable(self, job: RunningJob, now: float) -> bool:
        """Whether reclaim may evict this borrower now: it has run its minimum and has not
        been evicted as often as the policy allows."""
        if now - job.started_at < self.reclaim_min_runtime_seconds:
            return False
        cap = self.max_evictions_per_job
        return cap is None or job.evictions < cap

    def lane_of(self, job: QueuedJob) -> tuple[str, str, str]:
        size = "all"
        if self.small_job_max_gpus is not None:
            size = "small" if job.gpus <= self.small_job_max_gpus else "large"
        return (job.queue, job.service_class.value, size)

    def ordering_of(self, queue: str) -> Ordering:
        spec = self.queues.get(queue)
        return spec.ordering if spec is not None and spec.ordering is not None else self.ordering

    def backfill_of(self, queue: str) -> bool:
        spec = self.queues.get(queue)
        return spec.backfill if spec is not None and spec.backfill is not None else self.backfill

    def quota(self, queue: str) -> int | None:
        spec = self.queues.get(queue)
        if spec is not None and spec.nominal_gpus is not None:
            return spec.nominal_gpus
        return self.quotas.get(queue)

    def default_runtime(self, queue: str) -> float:
        spec = self.queues.get(queue)
        if spec is not None and spec.default_runtime_seconds is not None:
            return spec.default_runtime_seconds
        return self.default_runtime_seconds

    def order_key(self, job: QueuedJob) -> tuple[float, float, str]:
        ordering = self.ordering_of(job.queue)
        if ordering is Ordering.PRIORITY:
            return (-job.priority, job.submitted_at, job.key)
        if ordering is Ordering.SHORTEST:
            runtime = job.runtime_estimate or self.default_runtime(job.queue)
            return (runtime * job.gpus, job.submitted_at, job.key)
        return (job.submitted_at, 0.0, job.key)

    def priority_limit(self, queue: str) -> int | None:
        spec = self.queues.get(queue)
        if spec is not None and spec.max_priority is not None:
            return spec.max_priority
        return self.max_priority.get(queue, self.max_priority.get("*"))

    def weight(self, queue: str) -> float:
        spec = self.queues.get(queue)
        raw = spec.weight if spec is not None else self.weights.get(queue, 1.0)
        return max(1e-9, raw)

    def quota_map(self) -> dict[str, int]:
        """Every queue's nominal quota (Queue objects over flat quotas), for accounting."""
        quotas = dict(self.quotas)
        for name, spec in self.queues.items():
            if spec.nominal_gpus is not None:
                quotas[name] = spec.nominal_gpus
        return quotas


def policy_refusal(policy: QueuePolicy, job: QueuedJob) -> str | None:
    """What the queue's policy never allows this job, whatever else runs; None when allowed."""
    spec = policy.queues.get(job.queue)
    if spec is None and policy.require_known_queue:
        return f"queue {job.queue} does not exist (spec.queue)"
    if spec is not None:
        refused = spec.accepts(job.gpus)
        if refused is not None:
            return refused
    limit = policy.priority_limit(job.queue)
    if limit is not None and job.priority > limit:
        return f"spec.priority {job.priority} is above queue {job.queue}'s maximum of {limit}"
    refused = _pod_priority_refusal(job, limit)
    if refused is not None:
        return refused
    quota = policy.quota(job.queue)
    if job.service_class is ServiceClass.GUARANTEED and quota is not None and job.gpus > quota:
        borrowable = most_borrowable(policy.queues, job.queue, own_quota=True)
        if borrowable is None or job.gpus > borrowable:
            beyond = (
                "" if borrowable is None else f" or than its cohort could ever lend ({borrowable})"
            )
            return (
                f"needs {job.gpus} guaranteed GPUs, more than queue {job.queue}'s "
                f"whole quota of {quota}{beyond}"
            )
    return None


def _pod_priority_refusal(job: QueuedJob, limit: int | None) -> str | None:
    """A queue's maximum priority bounds its jobs' PriorityClass values as well as their
    spec.priority: a worker's class decides whom other schedulers' preemption and the
    kubelet's eviction spare, so a tenant must not name more than the queue allows."""
    asked = job.pod_priority
    if asked is None:
        return None
    field = "spec.template.spec.priorityClassName"
    if asked.value is None:
        return f"{field}: PriorityClass {asked.class_name} does not exist"
    if limit is not None and asked.value > limit:
        return (
            f"{field}: PriorityClass {asked.class_name} (value {asked.value}) is above queue "
            f"{job.queue}'s maximum priority of {limit}"
        )
    return None


def order_lanes(
    policy: QueuePolicy,
    pending: list[QueuedJob],
    usage: Mapping[str, int],
    now: float | None = None,
) -> list[list[QueuedJob]]:
    """Pending jobs grouped into lanes, each lane ordered, lanes in visiting order.

    Jobs that have waited past the starvation bound go first in their lane, oldest first
    (ageing): under ShortestFirst or Priority a large or low job would otherwise never
    reach the head, and only a head reserves what it waits for."""
    lanes: dict[tuple[str, str, str], list[QueuedJob]] = {}
    for job in pending:
        lanes.setdefault(policy.lane_of(job), []).append(job)
    bound = policy.starvation_seconds
    for jobs in lanes.values():
        jobs.sort(key=policy.order_key)
        if bound is not None and now is not None:
            starving = [j for j in jobs if now - j.submitted_at >= bound]
            if starving:
                starving.sort(key=lambda j: (j.submitted_at, j.key))
                chosen = {id(j) for j in starving}
                jobs[:] = starving + [j for j in jobs if id(j) not in chosen]

    def lane_key(item: tuple[tuple[str, str, str], list[QueuedJob]]) -> tuple[object, ...]:
        (queue, _, _), jobs = item
        head = policy.order_key(jobs[0])
        if policy.fair_share:
            return (usage.get(queue, 0) / policy.weight(queue), head)
        return (head,)

    return [jobs for _, jobs in sorted(lanes.items(), key=lane_key)]
