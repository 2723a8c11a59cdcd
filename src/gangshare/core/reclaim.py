"""Reclaim (cycle phase 4): a cohort whose lenders took their quota back is over-lent, and
borrowers are chosen for eviction until what is borrowed fits what is lent."""

from __future__ import annotations

from gangshare.core.cluster import Cluster
from gangshare.core.job import ServiceClass
from gangshare.core.queueing import QueuePolicy, RunningJob
from gangshare.core.queues import CohortBook
from gangshare.core.results import CycleResult, Pending, PendingKind, Preemption


def reclaim_over_lent(
    result: CycleResult,
    policy: QueuePolicy,
    book: CohortBook,
    running: list[RunningJob],
    cluster: Cluster,
    now: float,
) -> None:
    """Evict borrowers of every over-lent cohort: lowest priority, least progress first, none
    that ran less than the policy's minimum or was evicted as often as it allows."""
    cohorts = {spec.cohort for spec in policy.queues.values() if spec.cohort}
    for cohort in sorted(cohorts):
        excess = book.over_lent(cohort)
        if excess <= 0:
            continue
        lent, held = book.lent(cohort), book.borrowed_in(cohort)
        members = {q.name for q in book.members(cohort)}
        # A borrower admitted earlier in this cycle may have counted on quota that a
        # guaranteed job behind it in its lane has since taken: undo such admissions first,
        # latest first (they lose no work), before evicting anything that runs.
        for admission in reversed(list(result.admitted)):
            if excess <= 0:
                break
            if not admission.borrowed or admission.job.queue not in members:
                continue
            excess -= admission.job.gpus
            book.borrowed[admission.job.queue] -= admission.job.gpus
            result.admitted.remove(admission)
            cluster.release(admission.plan.owner)
            reason = (
                f"cohort {cohort} lends {lent} GPU(s) now, less than its borrowers need: "
                "its lenders took their quota back in this cycle"
            )
            result.pending.append(Pending(admission.job, reason, PendingKind.QUOTA))
        borrowers = sorted(
            (
                j
                for j in running
                if j.borrowed and j.queue in members and policy.reclaimable(j, now)
            ),
            key=lambda j: (j.priority, -j.started_at, -j.gpus, j.key),
        )
        reason = (
            f"reclaimed: cohort {cohort}'s lenders took their quota back; it lends "
            f"{lent} GPU(s) now and borrowers held {held}"
        )
        _evict(borrowers, excess, reason, book, result)


def _evict(
    victims: list[RunningJob], excess: int, reason: str, book: CohortBook, result: CycleResult
) -> None:
    """Evict borrowers in the order given until `excess` GPUs are no longer borrowed."""
    for victim in victims:
        if excess <= 0:
            break
        excess -= victim.gpus
        book.borrowed[victim.queue] -= victim.gpus
        result.preemptions.append(Preemption(victim, reason))


def reclaim_for_waiting_lenders(
    result: CycleResult,
    policy: QueuePolicy,
    book: CohortBook,
    running: list[RunningJob],
    now: float,
) -> None:
    """A borrower on whole GPUs (a gang whose GPU resource is fixed, GangRequest.whole_gpus)
    holds GPUs a lender's job would otherwise get: share slots leave them free, these do not.
    So a job waiting for GPUs within its queue's quota takes that quota back, as an admitted
    one does in `reclaim_over_lent`, and such borrowers are evicted until the cohort lends
    what they hold. Counted in quota, not in places: once a victim is requeued its GPUs are
    no longer borrowed, so a pass that still sees its pods terminating evicts no one else."""
    demand: dict[str, int] = {}
    for pending in result.pending:
        job = pending.job
        spec = policy.queues.get(job.queue)
        if (
            pending.kind is not PendingKind.UNSCHEDULABLE
            or job.service_class is not ServiceClass.GUARANTEED
            or spec is None
            or spec.cohort is None
            or spec.nominal_gpus is None
        ):
            continue
        used = book.guaranteed.get(job.queue, 0) + demand.get(job.queue, 0)
        if used + job.gpus <= spec.nominal_gpus:
            demand[job.queue] = demand.get(job.queue, 0) + job.gpus
    if not demand:
        return
    queues = set(book.guaranteed) | set(demand)
    claimed = CohortBook(
        book.queues,
        {q: book.guaranteed.get(q, 0) + demand.get(q, 0) for q in queues},
        dict(book.borrowed),
    )
    taken = {p.job.key for p in result.preemptions}
    for cohort in sorted({c for q in demand if (c := policy.queues[q].cohort) is not None}):
        members = {q.name for q in book.members(cohort)}
        whole = sorted(
            (
                j
                for j in running
                if j.borrowed
                and j.service_class is ServiceClass.GUARANTEED
                and j.queue in members
                and j.key not in taken
                and policy.reclaimable(j, now)
            ),
            key=lambda j: (j.priority, -j.started_at, -j.gpus, j.key),
        )
        excess = min(claimed.over_lent(cohort), sum(j.gpus for j in whole))
        reason = (
            f"reclaimed: cohort {cohort}'s lenders have jobs waiting for the GPUs it borrows "
            f"whole; it lends {claimed.lent(cohort)} GPU(s) to them now"
        )
        _evict(whole, excess, reason, book, result)
