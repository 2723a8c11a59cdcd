"""A tiny discrete-event loop over `schedule_cycle`, for the cohort and backfill properties.

Jobs run exactly their duration; admissions are assumed into the live cluster by the cycle
itself; preemptions release the victim's gang and requeue it (never lost), as the operator does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gangshare.core import Cluster, ServiceClass
from gangshare.core.cycle import CycleResult, schedule_cycle
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.queues import CohortBook


@dataclass
class World:
    cluster: Cluster
    policy: QueuePolicy
    now: float = 0.0
    duration: dict[str, float] = field(default_factory=dict)
    arrivals: list[QueuedJob] = field(default_factory=list)
    pending: dict[str, QueuedJob] = field(default_factory=dict)
    running: dict[str, RunningJob] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    # Every admitted job as it was queued, so a preempted one is requeued unchanged.
    queued: dict[str, QueuedJob] = field(default_factory=dict)
    results: list[CycleResult] = field(default_factory=list)

    def submit(self, job: QueuedJob, duration: float) -> None:
        self.duration[job.key] = duration
        self.arrivals.append(job)
        self.arrivals.sort(key=lambda j: (j.submitted_at, j.key))

    def next_event(self) -> float | None:
        """When something next happens after now (an arrival, an end); None: nothing will."""
        times = [j.submitted_at for j in self.arrivals]
        times += [r.expected_end for r in self.running.values() if r.expected_end is not None]
        later = [t for t in times if t > self.now or not self.results]
        return min(later) if later else None

    def advance(self, now: float) -> None:
        """Move the clock: finished jobs leave the cluster, due jobs arrive."""
        self.now = now
        for key, held in list(self.running.items()):
            if held.expected_end is not None and held.expected_end <= now:
                self.cluster.release(key)
                del self.running[key]
        while self.arrivals and self.arrivals[0].submitted_at <= now:
            arrived = self.arrivals.pop(0)
            self.pending[arrived.key] = arrived

    def cycle(self) -> CycleResult:
        result = schedule_cycle(
            self.cluster,
            sorted(self.pending.values(), key=lambda j: j.key),
            list(self.running.values()),
            self.policy,
            self.now,
        )
        self.results.append(result)
        for preemption in result.preemptions:
            victim = preemption.job
            self.cluster.release(victim.key)
            del self.running[victim.key]
            job = self.queued[victim.key]
            self.pending[victim.key] = job
        for admission in result.admitted:
            job = admission.job
            del self.pending[job.key]
            self.queued[job.key] = job
            self.started.setdefault(job.key, self.now)
            self.running[job.key] = RunningJob(
                job.key,
                job.queue,
                job.gpus,
                admission.service_class,
                expected_end=self.now + self.duration[job.key],
                borrowed=admission.borrowed,
                priority=job.priority,
                started_at=self.now,
            )
        return result

    def book(self) -> CohortBook:
        """Guaranteed and borrowed GPUs per queue, as the running jobs hold them now."""
        book = CohortBook(self.policy.queues)
        for job in self.running.values():
            if job.borrowed:
                book.borrowed[job.queue] = book.borrowed.get(job.queue, 0) + job.gpus
            elif job.service_class is ServiceClass.GUARANTEED:
                book.guaranteed[job.queue] = book.guaranteed.get(job.queue, 0) + job.gpus
        return book


def cohort_violations(world: World) -> list[str]:
    """Quota and lending invariants the running set breaks now (empty when it keeps them)."""
    book = world.book()
    broken = []
    for name, spec in world.policy.queues.items():
        held = book.guaranteed.get(name, 0)
        if spec.nominal_gpus is not None and held > spec.nominal_gpus:
            broken.append(f"queue {name} holds {held} guaranteed GPUs, nominal {spec.nominal_gpus}")
        limit = spec.borrowing_limit
        if limit is not None and book.borrowed.get(name, 0) > limit:
            broken.append(f"queue {name} borrows {book.borrowed[name]}, limit {limit}")
        if spec.cohort is None and book.borrowed.get(name, 0):
            broken.append(f"queue {name} is in no cohort but borrows")
    for cohort in sorted({s.cohort for s in world.policy.queues.values() if s.cohort}):
        if book.borrowed_in(cohort) > book.lent(cohort):
            broken.append(
                f"cohort {cohort}: borrowed {book.borrowed_in(cohort)} > lent {book.lent(cohort)}"
            )
    return broken
