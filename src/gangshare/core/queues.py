"""Queues as first-class objects: quota, cohort lending and borrowing, accepted sizes.

A queue's `nominal_gpus` is its guaranteed quota: jobs within it run Guaranteed.
Queues that name the same `cohort` lend each other their idle quota: a job beyond
its queue's nominal quota may still run, as Opportunistic on borrowed capacity
(AntMan's meaning of the class), as long as the cohort has idle quota to lend and
the limits allow. When a lender's own demand returns, the cohort is over-lent and
borrowers are reclaimed (squeezed first by the node's coordinator, evicted whole
by the operator, requeued, never lost).

Accounting is in GPUs. A borrowed job counts all its GPUs as borrowed, even where
it shares a GPU with a Guaranteed tenant: deliberately conservative, so a queue's
borrowing is bounded by idle quota that really exists in its cohort.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

DEFAULT_QUEUE = "default"


class Ordering(StrEnum):
    FIFO = "FIFO"
    # Higher spec.priority first, FIFO among equals.
    PRIORITY = "Priority"
    # Least estimated GPU-time first (QSSF with predicted run times, SJF with exact ones).
    SHORTEST = "ShortestFirst"


@dataclass(frozen=True)
class QueueSpec:
    name: str
    # Guaranteed GPU quota; None means the queue has no quota (nothing limits it, it lends nothing).
    nominal_gpus: int | None = None
    # Most GPUs the queue may borrow from its cohort at once; None: as many as the cohort lends.
    borrowing_limit: int | None = None
    # Most of its idle quota the queue lends to its cohort; None: all of it.
    lending_limit: int | None = None
    weight: float = 1.0
    cohort: str | None = None
    # Job sizes (total GPUs) the queue accepts, so `small` and `large` queues can be declared.
    min_job_gpus: int = 1
    max_job_gpus: int | None = None
    # None: the operator's (or simulator's) global setting.
    ordering: Ordering | None = None
    backfill: bool | None = None
    max_priority: int | None = None
    # Backfill's run time for a job nothing else predicts.
    default_runtime_seconds: float | None = None

    def accepts(self, gpus: int) -> str | None:
        """Why the queue refuses a job of this size; None when it accepts it."""
        if gpus < self.min_job_gpus:
            return (
                f"queue {self.name} accepts jobs of at least {self.min_job_gpus} GPUs, "
                f"job has {gpus}"
            )
        if self.max_job_gpus is not None and gpus > self.max_job_gpus:
            return (
                f"queue {self.name} accepts jobs of at most {self.max_job_gpus} GPUs, "
                f"job has {gpus}"
            )
        return None

    def lendable(self, guaranteed_in_use: int) -> int:
        """Idle quota this queue offers its cohort now."""
        if self.nominal_gpus is None or self.cohort is None:
            return 0
        idle = max(0, self.nominal_gpus - guaranteed_in_use)
        return idle if self.lending_limit is None else min(idle, self.lending_limit)

    def most_lendable(self) -> int:
        """What the queue would lend with nothing of its own running."""
        return self.lendable(0)


@dataclass
class CohortBook:
    """Guaranteed and borrowed GPUs per queue in one cycle, updated as the cycle admits."""

    queues: Mapping[str, QueueSpec]
    guaranteed: dict[str, int] = field(default_factory=dict)
    borrowed: dict[str, int] = field(default_factory=dict)

    def members(self, cohort: str) -> list[QueueSpec]:
        return [q for q in self.queues.values() if q.cohort == cohort]

    def lent(self, cohort: str) -> int:
        """Idle quota the cohort's queues offer now."""
        return sum(q.lendable(self.guaranteed.get(q.name, 0)) for q in self.members(cohort))

    def borrowed_in(self, cohort: str) -> int:
        return sum(self.borrowed.get(q.name, 0) for q in self.members(cohort))

    def over_lent(self, cohort: str) -> int:
        """GPUs borrowers hold beyond what the cohort lends now: what must be reclaimed."""
        return max(0, self.borrowed_in(cohort) - self.lent(cohort))

    def borrow_refusal(self, queue: str, gpus: int) -> str | None:
        """Why `queue` may not borrow `gpus` GPUs now; None when it may."""
        spec = self.queues.get(queue)
        if spec is None or spec.cohort is None:
            return f"queue {queue} is in no cohort, so it cannot borrow"
        mine = self.borrowed.get(queue, 0)
        if spec.borrowing_limit is not None and mine + gpus > spec.borrowing_limit:
            return (
                f"queue {queue} borrows {mine} of at most {spec.borrowing_limit} GPUs, "
                f"job needs {gpus}"
            )
        free = self.lent(spec.cohort) - self.borrowed_in(spec.cohort)
        if gpus > free:
            return (
                f"cohort {spec.cohort} has {max(0, free)} idle GPU(s) of quota to lend, "
                f"job needs {gpus}"
            )
        return None

    def share(self, queue: str) -> float:
        """Guaranteed plus borrowed GPUs over the queue's weight: lower is served first."""
        spec = self.queues.get(queue)
        weight = spec.weight if spec is not None else 1.0
        used = self.guaranteed.get(queue, 0) + self.borrowed.get(queue, 0)
        return used / max(weight, 1e-9)


def most_borrowable(
    queues: Mapping[str, QueueSpec], queue: str, own_quota: bool = False
) -> int | None:
    """Most GPUs `queue` could ever borrow (every other lender idle); None: it is in no cohort.

    With `own_quota`, its own idle quota counts too: a job beyond the quota borrows all its
    GPUs from the cohort's pool, which holds the queue's own idle quota (`CohortBook.lent`).
    """
    spec = queues.get(queue)
    if spec is None or spec.cohort is None:
        return None
    pool = sum(
        q.most_lendable()
        for q in queues.values()
        if q.cohort == spec.cohort and (own_quota or q.name != queue)
    )
    return pool if spec.borrowing_limit is None else min(pool, spec.borrowing_limit)


def by_name(specs: Iterable[QueueSpec]) -> dict[str, QueueSpec]:
    return {spec.name: spec for spec in specs}
