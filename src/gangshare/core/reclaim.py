"""Reclaim (cycle phase 4): a cohort whose lenders took their quota back is over-lent, and
borrowers are chosen for eviction until what is borrowed fits what is lent."""

from __future__ import annotations

from gangshare.core.cluster import Cluster
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
        for victim in borrowers:
            if excess <= 0:
                break
            excess -= victim.gpus
            book.borrowed[victim.queue] -= victim.gpus
            reason = (
                f"reclaimed: cohort {cohort}'s lenders took their quota back; it lends "
                f"{lent} GPU(s) now and borrowers held {held}"
            )
            result.preemptions.append(Preemption(victim, reason))
